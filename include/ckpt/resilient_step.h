#pragma once

/// \file
/// A training step of one's own that survives running out of device memory: `ckpt::resilient_step`
/// runs it, and where it raises LibTorch's out-of-memory error, puts the step's state back (the
/// model's buffers, its parameters' gradients, the RNG) and runs it again, telling it how much the
/// failed run held so that it can choose a way that keeps less (docs/any-model.md, "Surviving out
/// of memory").
///
/// Example:
/// ```
/// const at::Tensor loss = ckpt::resilient_step(*model, [&](const ckpt::StepAttempt& attempt) {
///   // First plainly; after running out, checkpointed in more and more segments.
///   const at::Tensor y = attempt.index == 0
///       ? model->forward(x)
///       : ckpt::checkpoint_sequential(model, int64_t{2} << attempt.index, x);
///   const at::Tensor loss = torch::mse_loss(y, target);
///   loss.backward();
///   return loss;
/// });
/// optimizer.step();  // after the step: a run that failed never touched the parameters
/// ```

#include <torch/arg.h>
#include <torch/nn/module.h>

#include <c10/util/Exception.h>

#include <cstdint>
#include <memory>
#include <optional>

namespace ckpt {

/// What one run of a resilient step is told.
struct StepAttempt {
  /// 0 for the first run, 1 after the first ran out of memory, ...
  int index = 0;
  /// The bytes the run should hold at most above what lived before the step: none for the first
  /// run; afterwards a sixteenth below what the last failed run held, where the device's
  /// allocator keeps statistics (LibTorch 2.9 and later), else none.
  std::optional<int64_t> budget_bytes;
  /// What the last failed run held at its peak above the step's start, where known.
  std::optional<int64_t> failed_peak_bytes;
};

/// Options of `ckpt::resilient_step`.
struct ResilientStepOptions {
  /// How many runs a step gets in all; the last one's out-of-memory error passes on, with what
  /// each run held. At least 1. Default: 4
  TORCH_ARG(int, max_attempts) = 4;
  /// Say in one warning line that a step ran out of memory and ran again. Default: true
  TORCH_ARG(bool, warn) = true;
};

namespace detail {
/// The state a resilient step runs again from (src/execute/resilient_step.cpp).
class ResilientStep {
 public:
  ResilientStep(const torch::nn::Module& model, const ResilientStepOptions& options);
  ~ResilientStep();
  ResilientStep(const ResilientStep&) = delete;
  ResilientStep& operator=(const ResilientStep&) = delete;

  const StepAttempt& attempt() const;
  /// After a run raised `error`: puts the step's state back and prepares the next attempt, or,
  /// where none is left or the run changed the parameters, adds what happened to `error`, which
  /// the caller raises.
  bool recover(c10::OutOfMemoryError& error);

 private:
  struct State;
  std::unique_ptr<State> state_;
};
}  // namespace detail

/// Runs `step(attempt)` (a forward and backward of one's own, returning what it likes), and runs
/// it again where it raises `c10::OutOfMemoryError` (CUDA's, or any device whose allocator raises
/// it): before each new run, the model's buffers (BatchNorm statistics), its parameters'
/// gradients (from a host copy taken before the step) and the RNG of the CPU and the model's
/// device go back to where the step started, and `attempt` says how much the failed run held.
/// Returns what the run that got through returned. The step must not change the parameters
/// (call `optimizer.step()` after `resilient_step` returns): a run that did is not run again.
/// A warning line tells each survived run.
template <class Step>
auto resilient_step(torch::nn::Module& model, Step&& step,
                    const ResilientStepOptions& options = {}) {
  detail::ResilientStep state(model, options);
  for (;;) {
    try {
      return step(state.attempt());
    } catch (c10::OutOfMemoryError& error) {
      if (!state.recover(error)) throw;
    }
  }
}

}  // namespace ckpt
