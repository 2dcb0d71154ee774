#pragma once

// A `PlannedSequential` stage's part of a `ckpt::KeptReport`: a stage that runs as a checkpointed
// region names the region's report after itself; any other stage of the forward gets one of its
// own. Either way it lists what the executor holds of it until the backward: its input, its
// graph's output, a plain graph's saved tensors (measured), its RNG stash. A `PlannedModel`
// candidate that runs plainly lists its graph the same way.

#include <ckpt/memory_tracker.h>
#include <ckpt/plan/schedule.h>
#include <ckpt/report.h>

#include "autograd/rng_state.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace ckpt {
namespace detail {

/// What a plain forward keeps, measured: the bytes allocated on a device since construction and
/// still held. On the CPU, the calling thread's allocations; on an accelerator, its allocator's
/// count (every thread's): a MemoryTracker there would restart the device's high-water mark, which
/// the caller may be measuring.
class HeldSince {
 public:
  explicit HeldSince(c10::Device device);
  /// Adds to region `region` of `report` the graph the forward since construction keeps: what it
  /// holds, less `outputs` (those not among `inputs`), which are the caller's. An entry "graph",
  /// or a note where this LibTorch can't measure the device.
  void add_graph(KeptReport& report, size_t region, const std::vector<at::Tensor>& outputs,
                 const std::vector<at::Tensor>& inputs) const;

 private:
  int64_t allocated() const;  // bytes allocated on the device now

  c10::Device device_;
  bool measured_ = false;
  std::optional<MemoryTracker> tracker_;  // on the CPU
  int64_t before_ = 0;
};

class StageReport {
 public:
  /// Before stage `op.stage` runs on `input` in the forward; `mode` names how it stores.
  StageReport(KeptReport& report, const plan::Op& op, const at::Tensor& input, std::string mode);

  /// After it ran: whether the executor still holds its input (until the stage's backward),
  /// the output its graph holds (undefined without a graph), the RNG states the executor
  /// stashed for its recompute (or null), and whether it is the chain's last stage (whose
  /// output is the caller's).
  void finish(bool input_held, const at::Tensor& output, const RngStash* rng, bool last);

 private:
  KeptReport& report_;
  plan::Op op_;
  at::Tensor input_;
  std::string name_;
  std::string mode_;
  size_t first_;                   // the report's regions from here on are the stage's
  std::optional<HeldSince> held_;  // a plain stage's graph is measured
};

}  // namespace detail
}  // namespace ckpt
