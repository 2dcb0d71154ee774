#pragma once

// Instruments one training step of `ckpt train` for --plot and --trace: a thread that samples
// the counting allocator, and a recorder of forward / recompute / backward spans per stage.

#include "chrome_trace.h"
#include "gpt.h"

#include <ckpt/memory_tracker.h>
#include <ckpt/plan/schedule.h>
#include <ckpt/planned_sequential.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace ckpt {
namespace cli {

using Clock = std::chrono::steady_clock;

/// Samples `MemoryTracker::current_bytes()` of `device` every `period` on its own thread.
class MemorySampler {
 public:
  explicit MemorySampler(c10::Device device = c10::Device(c10::DeviceType::CPU),
                         std::chrono::microseconds period = std::chrono::microseconds(100))
      : period_(period), tracker_(device) {}
  ~MemorySampler() { stop(); }

  /// Starts sampling; times are measured from `origin`, sizes above `base_bytes`.
  void start(Clock::time_point origin, int64_t base_bytes);
  /// Stops and returns (seconds since origin, bytes above base) samples.
  std::vector<std::pair<double, int64_t>> stop();

 private:
  void sample();

  std::chrono::microseconds period_;
  Clock::time_point origin_;
  int64_t base_bytes_ = 0;
  MemoryTracker tracker_;
  std::atomic<bool> running_{false};
  std::thread thread_;
  std::vector<std::pair<double, int64_t>> samples_;
};

/// Records the spans of one step. As a `StageProbe` (strategies none and sequential:K) it times
/// stage forwards, tells recomputes (forwards during the backward pass) from forwards, and
/// places backward spans with gradient hooks on the stage outputs; for planned execution,
/// `observer()` receives the executor's operations instead.
class StepRecorder : public models::StageProbe {
 public:
  explicit StepRecorder(std::vector<std::string> stage_names);

  /// Starts recording a step whose time origin is `origin`.
  void begin(Clock::time_point origin);
  /// Marks the start of the backward pass (forwards from now on are recomputes).
  void begin_backward();
  /// Stops recording.
  void end();
  bool active() const { return active_; }

  /// A step-level span (forward, loss, backward, optimizer) at `row` 0.
  void add_phase(const std::string& name, Clock::time_point begin, Clock::time_point end);

  void on_forward_begin(int stage) override;
  void on_forward_end(int stage, const torch::Tensor& output) override;

  /// The step's memory peak: when it was reached and what was live there, for an instant event.
  void set_peak(Clock::time_point time, nlohmann::json breakdown);

  /// An `ExecutionObserver` that records a planned executor's operations into this recorder.
  std::shared_ptr<ExecutionObserver> observer();

  /// Adds the recorded step to `trace` as process `pid` named `name`, with the memory samples
  /// (seconds since origin, bytes) as a counter track.
  void write_to(ChromeTrace& trace, int pid, const std::string& name,
                const std::vector<std::pair<double, int64_t>>& memory) const;

 private:
  friend class RecorderObserver;
  struct Span {
    std::string name;
    std::string category;
    double begin_us;
    double end_us;
  };
  double now_us() const;
  std::string stage_label(int stage) const;
  std::string span_name(const std::string& kind, int stage) const;
  void on_op(const plan::Op& op, bool begin);

  std::vector<std::string> stage_names_;
  Clock::time_point origin_;
  bool active_ = false;
  bool backward_ = false;
  double backward_begin_us_ = 0;
  double backward_end_us_ = 0;
  mutable std::mutex mutex_;
  std::vector<Span> spans_, phases_;
  std::vector<double> forward_begin_us_;
  std::vector<std::pair<int, double>> grad_ready_;  // (i, time) when the gradient of x_i arrived
  std::vector<double> op_begin_us_;
  double peak_us_ = -1;  // none recorded
  nlohmann::json peak_;
};

}  // namespace cli
}  // namespace ckpt
