#include "progress.h"

#include "units.h"

#include <algorithm>
#include <cstdio>

#include <unistd.h>

namespace ckpt {
namespace cli {

Progress::Progress(std::string label, int total_steps)
    : label_(std::move(label)), total_steps_(std::max(1, total_steps)), tty_(isatty(2) != 0) {}

Progress::~Progress() {
  finish();
}

void Progress::update(int step, double loss, double tokens_per_second, int64_t current_bytes,
                      int64_t peak_bytes) {
  const int every = std::max(1, total_steps_ / 10);
  if (!tty_ && step != total_steps_ && step % every != 0 && step != 1) return;
  char line[256];
  if (tty_) {
    constexpr int kBar = 20;
    const int filled = kBar * step / total_steps_;
    std::string bar(static_cast<size_t>(filled), '#');
    bar.append(static_cast<size_t>(kBar - filled), '.');
    std::snprintf(line, sizeof line,
                  "\r[%-14s] [%s] step %d/%d  loss %.4f  %.0f tok/s  mem %s (peak %s)\x1b[K",
                  label_.c_str(), bar.c_str(), step, total_steps_, loss, tokens_per_second,
                  format_bytes(current_bytes).c_str(), format_bytes(peak_bytes).c_str());
    open_line_ = true;
  } else {
    std::snprintf(line, sizeof line, "[%s] step %d/%d  loss %.4f  %.0f tok/s  mem %s (peak %s)\n",
                  label_.c_str(), step, total_steps_, loss, tokens_per_second,
                  format_bytes(current_bytes).c_str(), format_bytes(peak_bytes).c_str());
  }
  std::fputs(line, stderr);
  std::fflush(stderr);
}

void Progress::finish() {
  if (open_line_) {
    std::fputs("\n", stderr);
    std::fflush(stderr);
    open_line_ = false;
  }
}

}  // namespace cli
}  // namespace ckpt
