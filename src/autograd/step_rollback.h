#pragma once

// Putting a training step's forward back where it fails: the random streams and the model's
// buffers as they were before it.

#include "buffer_guard.h"
#include "rng_state.h"

#include <memory>
#include <optional>

namespace torch {
namespace nn {
class Module;
}  // namespace nn
}  // namespace torch

namespace ckpt {
namespace detail {

/// Copies the random states (those of the CPU and of the model's parameters' device type) and the
/// buffers of `model`, and writes them back when destroyed unless dismissed: a forward that throws
/// leaves the generators and the running statistics as they were. The copies are memory the
/// forward holds (the CPU generator's state is 5 KB), so a step planned to the byte must be
/// profiled holding them too.
class StepRollback {
 public:
  explicit StepRollback(const std::shared_ptr<torch::nn::Module>& model);
  ~StepRollback();
  StepRollback(const StepRollback&) = delete;
  StepRollback& operator=(const StepRollback&) = delete;

  /// The forward completed: nothing is written back, and the copies are let go of.
  void dismiss();

 private:
  std::optional<RngStash> rng_;
  BufferGuard buffers_;
};

}  // namespace detail
}  // namespace ckpt
