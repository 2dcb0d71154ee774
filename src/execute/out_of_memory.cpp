#include "out_of_memory.h"

#include "compat/torch_compat.h"

#include <ATen/core/grad_mode.h>

#include <algorithm>

namespace ckpt {
namespace detail {
namespace {

std::optional<c10::Device> measurable_device(const std::vector<at::Tensor>& tensors) {
  for (const at::Tensor& t : tensors) {
    if (!t.defined() || t.is_cpu()) continue;
    if (!compat::device_memory_measurable(t.device().type())) return std::nullopt;
    return t.device();
  }
  return std::nullopt;
}

}  // namespace

StepStart::StepStart(const torch::nn::Module& model, const std::vector<at::Tensor>& device_tensors)
    : rng_(device_tensors, infer_device_type(device_tensors)),
      device_(measurable_device(device_tensors)) {
  const at::NoGradGuard no_grad;
  for (const at::Tensor& buffer : model.buffers()) {
    if (!buffer.defined()) continue;
    buffers_.push_back(buffer);
    buffer_copies_.push_back(buffer.clone());
  }
  for (const at::Tensor& parameter : model.parameters()) {
    parameters_.push_back(parameter);
    const at::Tensor& grad = parameter.grad();
    // On the host: the copy must not take the device memory the step may run short of.
    gradient_copies_.push_back(grad.defined() ? grad.to(c10::kCPU, /*non_blocking=*/false,
                                                        /*copy=*/true)
                                              : at::Tensor());
  }
  start_again();
}

void StepStart::start_again() {
  if (!device_) return;
  // After a failed run, its own peak would hide the next one's: start the device's mark again.
  if (measured_once_) compat::reset_device_peak(*device_);
  measured_once_ = true;
  const compat::DeviceMemoryStats stats = compat::device_memory_stats(*device_);
  start_bytes_ = stats.allocated_bytes;
  start_peak_ = stats.peak_allocated_bytes;
}

std::optional<int64_t> StepStart::held_bytes() const {
  if (!device_) return std::nullopt;
  const int64_t peak = compat::device_memory_stats(*device_).peak_allocated_bytes;
  if (peak <= start_peak_) return std::nullopt;  // an earlier peak hides the step's
  return peak - start_bytes_;
}

void StepStart::restore_buffers_and_gradients() const {
  const at::NoGradGuard no_grad;
  for (size_t i = 0; i < buffers_.size(); ++i) buffers_[i].copy_(buffer_copies_[i]);
  for (size_t i = 0; i < parameters_.size(); ++i) {
    at::Tensor parameter = parameters_[i];
    if (!gradient_copies_[i].defined()) {
      parameter.mutable_grad().reset();
    } else if (parameter.grad().defined()) {
      parameter.mutable_grad().copy_(gradient_copies_[i]);
    } else {
      parameter.mutable_grad() = gradient_copies_[i].to(parameter.device(), /*non_blocking=*/false,
                                                        /*copy=*/true);
    }
  }
}

int64_t budget_after_out_of_memory(int64_t predicted_peak_bytes,
                                   std::optional<int64_t> held_bytes) {
  const int64_t below_prediction = predicted_peak_bytes - 1;
  if (held_bytes) return std::max<int64_t>(0, std::min(*held_bytes, below_prediction));
  return std::max<int64_t>(0, predicted_peak_bytes - predicted_peak_bytes / 16);
}

std::string replanned_message(const char* planner, const char* where,
                              const c10::OutOfMemoryError& error, int64_t old_budget_bytes,
                              int64_t new_budget_bytes, int64_t new_predicted_peak_bytes) {
  std::string cause = error.what_without_backtrace();
  cause = cause.substr(0, cause.find('\n'));
  return c10::str(planner, ": the step ran out of device memory in its ", where, " (", cause,
                  ") under the plan for ", old_budget_bytes,
                  " bytes; it ran again under the plan for ", new_budget_bytes,
                  " bytes (predicted peak ", new_predicted_peak_bytes,
                  " bytes), which later steps keep.");
}

void explain_no_smaller_plan(c10::OutOfMemoryError& error, const char* planner,
                             int64_t budget_bytes, int64_t predicted_peak_bytes,
                             int64_t smallest_feasible_bytes) {
  error.add_context(
      c10::str(planner,
               " (on_out_of_memory(OutOfMemory::Replan)): the step ran out of device memory under "
               "its plan for ",
               budget_bytes, " bytes (predicted peak ", predicted_peak_bytes,
               " bytes), and no plan leaves more room: the smallest feasible budget is ",
               smallest_feasible_bytes,
               " bytes. Free device memory, use a smaller input, or mark more or "
               "smaller candidates."));
}

}  // namespace detail
}  // namespace ckpt
