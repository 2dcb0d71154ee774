#pragma once

// OutOfMemory::Replan, what both planners share: the state a step starts from, to run it again
// after the device ran out of memory, what the failed step held, and the budget to plan for next.

#include "autograd/rng_state.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/Device.h>
#include <c10/util/Exception.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ckpt {
namespace detail {

/// What a step starts from: the RNG of the CPU and of the step's device type, the model's
/// buffers, and its parameters' gradients (a host copy of those that exist), to put back before
/// the step runs again; and the device memory allocated then, to tell what the step held.
class StepStart {
 public:
  /// `device_tensors`: tensors on the step's device (its parameters, or its input).
  StepStart(const torch::nn::Module& model, const std::vector<at::Tensor>& device_tensors);

  /// The most bytes the step held on its device above its start, where the device's allocator
  /// keeps statistics and the step raised their high-water mark; none otherwise.
  std::optional<int64_t> held_bytes() const;
  /// Runs the step again after it ran out of memory with `error`, as often as it runs out: each
  /// time the buffers, gradients (and, in the forward, the RNG) go back to the step's start,
  /// `replan(error, held_bytes())` plans for less (or raises `error` where nothing leaves more
  /// room), and `run()` runs under grad mode. From the backward, `run` draws what the step drew
  /// the first time and the RNG then goes on from where the program had taken it.
  template <class Replan, class Run>
  auto run_again(c10::OutOfMemoryError& error, bool in_backward, Replan&& replan, Run&& run) {
    for (;;) {
      restore_buffers_and_gradients();
      if (!in_backward) rng_.restore();  // also where the error passes on
      replan(error, held_bytes());
      start_again();
      const at::AutoGradMode grad_mode(true);  // inside the engine, grad mode is off
      std::optional<RngFork> from_start;
      if (in_backward) from_start.emplace(rng_);
      try {
        return run();
      } catch (c10::OutOfMemoryError& again) {
        error = again;
      }
    }
  }

  /// Puts the buffers, the gradients and the RNG back as they were at the start, and measures the
  /// next run of the step from there.
  void rewind() {
    restore_buffers_and_gradients();
    rng_.restore();
    start_again();
  }

 private:
  /// Starts measuring at what is allocated now; called again for another run of the step, it
  /// starts the device's high-water mark again there (a failed run's peak would hide the next).
  void start_again();

  /// Puts the buffers and the gradients back as they were at the start.
  void restore_buffers_and_gradients() const;

  RngStash rng_;
  std::vector<at::Tensor> buffers_, buffer_copies_;
  std::vector<at::Tensor> parameters_, gradient_copies_;  // an undefined copy: it had none
  std::optional<c10::Device> device_;                     // where memory statistics can be read
  int64_t start_bytes_ = 0;
  int64_t start_peak_ = 0;
  bool measured_once_ = false;
};

/// The budget to plan for after a step whose plan predicted `predicted_peak_bytes` ran out of
/// memory: what it held when it did, or, where that is not known, a sixteenth less than the
/// prediction; always below the prediction.
int64_t budget_after_out_of_memory(int64_t predicted_peak_bytes, std::optional<int64_t> held_bytes);

/// The one line a survived step warns with; `where`: "forward" or "backward".
std::string replanned_message(const char* planner, const char* where,
                              const c10::OutOfMemoryError& error, int64_t old_budget_bytes,
                              int64_t new_budget_bytes, int64_t new_predicted_peak_bytes);

/// Adds the failed plan's figures to `error`, which passes on: no plan leaves more room.
void explain_no_smaller_plan(c10::OutOfMemoryError& error, const char* planner,
                             int64_t budget_bytes, int64_t predicted_peak_bytes,
                             int64_t smallest_feasible_bytes);

}  // namespace detail
}  // namespace ckpt
