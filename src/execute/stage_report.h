#pragma once

// A `PlannedSequential` stage's part of a `ckpt::KeptReport`: a stage that runs as a checkpointed
// region names the region's report after itself; any other stage of the forward gets one of its
// own. Either way it lists what the executor holds of it until the backward: its input, its
// graph's output, a plain graph's saved tensors (measured), its RNG stash.

#include <ckpt/memory_tracker.h>
#include <ckpt/plan/schedule.h>
#include <ckpt/report.h>

#include "autograd/rng_state.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstddef>
#include <optional>
#include <string>

namespace ckpt {
namespace detail {

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
  void add_graph(const at::Tensor& output);
  int64_t allocated() const;  // bytes allocated on the input's device now

  KeptReport& report_;
  plan::Op op_;
  at::Tensor input_;
  std::string name_;
  std::string mode_;
  size_t first_;  // the report's regions from here on are the stage's
  c10::Device device_;
  bool measured_ = false;                 // a plain stage's graph is measured
  std::optional<MemoryTracker> tracker_;  // on the CPU
  int64_t before_ = 0;
};

}  // namespace detail
}  // namespace ckpt
