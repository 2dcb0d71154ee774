#pragma once

/// \file
/// Offloading activations to host memory: the C++ counterpart of Python's
/// `torch.autograd.graph.save_on_cpu`. docs/offloading.md compares it with checkpointing.

#include <ckpt/options.h>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/arg.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace ckpt {
namespace detail {
class LabelScope;
class OffloadGroup;
class OffloadedRecord;
class SavedTensorHooksScope;
}  // namespace detail

/// While it lives, every tensor that autograd saves for the backward on this thread goes to host
/// memory, and comes back when the backward needs it, as Python's `save_on_cpu` does, with the
/// copies overlapped with compute:
///   - a saved tensor's data is copied to the host on a side stream of its device, after the work
///     that computed it; the guard's end makes the device's current stream wait for the copies and
///     lets go of the device's copy (what the caller still holds stays);
///   - the backward's first use of any of them brings all of them back on the side stream, last
///     saved first (the order a backward reads them in), and behind them the data of the
///     `look_ahead` guards or offloaded regions whose forward ended just before this one's on
///     this thread (the ones the backward reaches next); a use waits for its guard's copies;
///   - data shared by several saved tensors (a view and its base; an output that two operators
///     save) moves once;
///   - data already in host memory, and parameters and other leaves that require grad (which
///     stay on the device anyway), are kept as they are: a CPU-only program under the guard copies
///     nothing;
///   - data that requires no grad is copied at the guard's end, if nothing else holds it then: a
///     frozen parameter and the caller's batch stay, a dropout mask moves.
/// Gradients are the same bits as without the guard. The host memory a guard's data holds is
/// freed as the backward uses it up (or with the graph). Regions checkpointed inside the guard
/// keep their internal graphs out of it (their nodes hold their arguments on the device), and so
/// do their recomputes. Needs LibTorch's own autograd engine, which ckpt extends for
/// this once, at the first guard: a process that loaded torch's Python bindings raises an error.
///
/// Example:
/// ```
/// torch::Tensor loss;
/// {
///   ckpt::OffloadGuard offload;
///   loss = model->forward(batch).mean();
/// }
/// loss.backward();
/// ```
class OffloadGuard {
 public:
  explicit OffloadGuard(const OffloadOptions& options = {});
  ~OffloadGuard();
  OffloadGuard(const OffloadGuard&) = delete;
  OffloadGuard& operator=(const OffloadGuard&) = delete;

  /// Bytes this guard's data holds in host memory now.
  int64_t host_bytes() const;

 private:
  std::shared_ptr<detail::OffloadGroup> group_;
  std::unique_ptr<detail::SavedTensorHooksScope> scope_;
};

/// Offloaded data in this process (guards, offloaded regions and selective offloading together):
/// the host memory it holds now, and at most since the process started or `reset_offload_peak()`;
/// the host memory the pool keeps for the next copies; the device memory of data brought back
/// ahead of the backward that reads it (`OffloadOptions::look_ahead`).
struct OffloadStats {
  int64_t host_bytes = 0;
  int64_t peak_host_bytes = 0;
  int64_t pooled_host_bytes = 0;
  int64_t ahead_device_bytes = 0;
};
OffloadStats offload_stats();
void reset_offload_peak();
/// Frees the host buffers the pool keeps for reuse (the pool keeps at most the peak of offloaded
/// host memory; this gives it back to the system, for a program that offloads no more).
void empty_offload_pool();

/// Bytes per second that offloading's copies move between `device` and host memory: the median
/// of `repeats` round trips of `bytes` bytes (to the host and back, on the side stream offloading
/// uses, into the memory it would use), counting both directions. What the profiler gives the
/// planner as `plan::Chain::host_bandwidth`. `device` must be an accelerator.
double measure_host_bandwidth(c10::Device device, int64_t bytes, int repeats = 3);

namespace detail {

/// The forward of a region with `CheckpointOptions().offload(true)`: checks the options and the
/// arguments, enters the forward context and its region's memory label ("region 3"), offloads
/// what autograd saves, as an OffloadGuard does, and records into the active report, until
/// `finish`.
class OffloadedRegion {
 public:
  OffloadedRegion(const CheckpointOptions& options, const std::vector<at::Tensor>& inputs);
  ~OffloadedRegion();
  OffloadedRegion(const OffloadedRegion&) = delete;
  OffloadedRegion& operator=(const OffloadedRegion&) = delete;

  /// The function returned `outputs`. They and the arguments stay on the device (for what comes
  /// next, and with whoever passed them), so what the backward needs of them is used where it is,
  /// not moved.
  void finish(const std::vector<at::Tensor>& outputs);

 private:
  std::vector<at::Tensor> inputs_;
  RegionContext context_;
  std::unique_ptr<LabelScope> label_;
  std::shared_ptr<OffloadGroup> group_;
  std::unique_ptr<OffloadedRecord> record_;
  std::unique_ptr<SavedTensorHooksScope> scope_;
};

}  // namespace detail
}  // namespace ckpt
