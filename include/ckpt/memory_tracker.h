#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <chrono>
#include <cstdint>
#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

namespace torch {
namespace optim {
class Optimizer;
}  // namespace optim
}  // namespace torch

namespace ckpt {

namespace detail {
struct ThreadCounter;
}  // namespace detail

/// Whose allocations a MemoryTracker counts.
enum class MemoryScope {
  /// Every thread's (the default).
  Process,
  /// Only those the constructing thread makes (CPU only): other threads' work, concurrent
  /// profiling say, does not move its counts. Blocks it allocated still count down when another
  /// thread frees them. LibTorch runs a CPU backward pass on the calling thread; scratch buffers
  /// of intra-op worker threads are not counted.
  CallingThread,
};

/// What was live at a tracker's peak, by kind (see `MemoryTracker::peak_breakdown`).
///
/// The parts (parameters, gradients, optimizer state, each label's bytes and `other_bytes`) sum
/// to `peak_bytes` exactly. Only activations (what the forward pass allocates and the backward
/// pass reads) can be lowered by checkpointing; a peak made mostly of the rest can't be.
struct MemoryBreakdown {
  /// Bytes live at the peak, all of them: the parts below sum to it.
  int64_t peak_bytes = 0;
  /// The label (see `MemoryLabel`) of the allocation that reached the peak, such as "backward"
  /// or "forward/region 3/recompute"; empty where it had none, or where the peak is the point
  /// where recording (or the last `reset_peak()`) began.
  std::string where;
  /// When the peak was reached.
  std::chrono::steady_clock::time_point time;
  /// The storages of the parameters passed to `peak_breakdown`, each counted once.
  int64_t parameters_bytes = 0;
  /// Those of the parameters' `grad()`.
  int64_t gradients_bytes = 0;
  /// Those of the optimizer state tensors passed.
  int64_t optimizer_state_bytes = 0;
  /// The rest, by the label current at its allocation, largest first: the activations of each
  /// labelled stage and checkpointed region, those of its recompute, the backward pass's
  /// temporaries ("backward"), ...
  std::vector<std::pair<std::string, int64_t>> labels;
  /// The rest of the rest: allocated under no label, or before recording began.
  int64_t other_bytes = 0;
};

/// Writes `breakdown` on one line, in bytes: `peak 1234 B at backward: parameters 100 B, ...`.
std::ostream& operator<<(std::ostream& out, const MemoryBreakdown& breakdown);

/// The state tensors of a LibTorch optimizer (Adam, AdamW, SGD, RMSprop, Adagrad, LBFGS): what
/// `MemoryTracker::peak_breakdown` counts as optimizer state. Raises an error for another
/// optimizer type: collect its state tensors yourself.
std::vector<at::Tensor> optimizer_state_tensors(const torch::optim::Optimizer& optimizer);

/// Counts the bytes that live tensors hold on a device.
///
/// On the CPU (the default), the first tracker constructed in a process installs a counting
/// allocator with `c10::SetCPUAllocator`; it stays installed for the life of the process and
/// forwards to the allocator that was there before. Only memory allocated after that point is
/// counted. CPU trackers are thread-safe, and each keeps its own peak.
///
/// On an accelerator (CUDA, XPU, ...; LibTorch 2.9 or later), a tracker reads the caching
/// allocator's statistics: bytes allocated to tensors now, and their high-water mark. That mark
/// is one per device, so constructing a tracker or calling `reset_peak()` restarts it for every
/// tracker of the device. Where a device's memory can't be measured, the constructor raises an
/// error (`can_measure` tells beforehand); it never reports zero.
///
/// Example:
/// ```
/// ckpt::MemoryTracker tracker;
/// const int64_t before = tracker.current_bytes();
/// model->forward(x).sum().backward();
/// std::cout << "peak: " << tracker.peak_bytes() - before << " bytes\n";
/// ```
class MemoryTracker {
 public:
  /// Tracks `device` (CPU by default; an accelerator without an index means index 0; the meta
  /// device counts as the active `ckpt::ModeledDevice` rounds), counting the allocations of
  /// `scope`.
  explicit MemoryTracker(c10::Device device = c10::Device(c10::DeviceType::CPU),
                         MemoryScope scope = MemoryScope::Process);
  ~MemoryTracker();
  MemoryTracker(const MemoryTracker&) = delete;
  MemoryTracker& operator=(const MemoryTracker&) = delete;

  /// Whether trackers can measure `device` with this LibTorch build.
  static bool can_measure(c10::Device device);

  /// The device whose memory this tracker counts.
  c10::Device device() const { return device_; }

  /// Bytes allocated on the device and still live: process-wide, or allocated by the tracker's
  /// thread since it began counting (MemoryScope::CallingThread).
  int64_t current_bytes() const;
  /// High-water mark of `current_bytes()` since construction or the last `reset_peak()`.
  int64_t peak_bytes() const;
  /// Starts a new high-water mark at the current value.
  void reset_peak();

  /// From now on, keeps at each new peak how many bytes are live under each label (see
  /// `MemoryLabel`), for `peak_breakdown`. CPU and MemoryScope::Process only: an accelerator's
  /// caching allocator keeps statistics, not blocks, and raises an error here. While any
  /// tracker records, each allocation takes a lock and each new peak copies one count per label
  /// (peaks are rare after a training loop's first step); other trackers cost what they did.
  void record_breakdown();

  /// What was live at the peak, by kind: the storages of `parameters`, of their `grad()` and of
  /// `optimizer_state` (see `optimizer_state_tensors`) that were live there, matched by their
  /// blocks, each counted once; the rest by label. Call it while those tensors still exist (after
  /// the optimizer step, say): a tensor freed since the peak can't be named. Tensors allocated
  /// before the process's first tracker installed the counting allocator are not counted at all:
  /// construct a tracker before the model to see its parameters. Needs `record_breakdown()`
  /// first.
  ///
  /// Example:
  /// ```
  /// ckpt::MemoryTracker tracker;
  /// tracker.record_breakdown();
  /// { ckpt::MemoryLabel label("forward"); loss = model->forward(x).sum(); }
  /// { ckpt::MemoryLabel label("backward"); loss.backward(); }
  /// optimizer.step();
  /// std::cout << tracker.peak_breakdown(model->parameters(),
  ///                                     ckpt::optimizer_state_tensors(optimizer)) << "\n";
  /// ```
  MemoryBreakdown peak_breakdown(const std::vector<at::Tensor>& parameters,
                                 const std::vector<at::Tensor>& optimizer_state = {}) const;

 private:
  c10::Device device_;
  int slot_ = -1;                            // the CPU allocator's peak slot; -1 on an accelerator
  detail::ThreadCounter* thread_ = nullptr;  // MemoryScope::CallingThread
  bool recording_ = false;                   // record_breakdown() was called
};

}  // namespace ckpt
