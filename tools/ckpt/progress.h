#pragma once

// The live progress line of `ckpt train` on stderr: redrawn in place ("\r") on a terminal,
// plain lines (every tenth of the run, and the last step) otherwise.

#include <cstdint>
#include <string>

namespace ckpt {
namespace cli {

class Progress {
 public:
  /// `label` names the run ("baseline", "sequential:4"); `total_steps` > 0.
  Progress(std::string label, int total_steps);
  ~Progress();

  /// Reports a finished step (1-based `step`).
  void update(int step, double loss, double tokens_per_second, int64_t current_bytes,
              int64_t peak_bytes);
  /// Ends the line (on a terminal); idempotent.
  void finish();

 private:
  std::string label_;
  int total_steps_;
  bool tty_;
  bool open_line_ = false;
};

}  // namespace cli
}  // namespace ckpt
