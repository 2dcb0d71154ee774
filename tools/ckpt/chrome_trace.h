#pragma once

// `ckpt train --trace FILE`: Chrome trace JSON (chrome://tracing, https://ui.perfetto.dev).

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace ckpt {
namespace cli {

/// Collects complete events ("ph": "X"), instant events ("ph": "i") and counter samples
/// ("ph": "C") and writes them in the Trace Event Format. Times are microseconds.
class ChromeTrace {
 public:
  /// Names a process (one per training run) in the viewer.
  void set_process_name(int pid, const std::string& name);
  /// Names a thread row within a process.
  void set_thread_name(int pid, int tid, const std::string& name);
  /// A span [begin_us, end_us] named `name` in category `category` ("forward", "recompute",
  /// "backward", "step", ...).
  void add_span(int pid, int tid, const std::string& name, const std::string& category,
                double begin_us, double end_us);
  /// One sample of the counter track `name` (e.g. "memory") with a value in bytes.
  void add_counter(int pid, const std::string& name, double time_us, int64_t value);

  /// An instant event `name` at `time_us` marked across process `pid`, with `args` shown when
  /// it is selected (the peak's breakdown, say).
  void add_instant(int pid, const std::string& name, double time_us, nlohmann::json args);

  /// The JSON document: {"traceEvents": [...], "displayTimeUnit": "ms"}.
  std::string to_json() const;
  /// Writes `to_json` to `path`; throws std::runtime_error on failure.
  void write(const std::string& path) const;

  size_t size() const { return events_.size(); }

 private:
  struct Event {
    char phase;
    int pid;
    int tid;
    std::string name;
    std::string category;
    double time_us;
    double duration_us;
    int64_t value;
    nlohmann::json args;  // instant events
  };
  std::vector<Event> events_;
};

}  // namespace cli
}  // namespace ckpt
