#include <ckpt/resilient_step.h>

#include "execute/out_of_memory.h"

#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <string>
#include <vector>

namespace ckpt {
namespace detail {
namespace {

std::vector<at::Tensor> parameters_of(const torch::nn::Module& model) {
  std::vector<at::Tensor> parameters;
  for (const at::Tensor& p : model.parameters()) parameters.push_back(p);
  return parameters;
}

std::vector<uint32_t> versions_of(const std::vector<at::Tensor>& tensors) {
  std::vector<uint32_t> versions;
  for (const at::Tensor& t : tensors) versions.push_back(t._version());
  return versions;
}

std::string first_line(const c10::Error& error) {
  const std::string what = error.what_without_backtrace();
  return what.substr(0, what.find('\n'));
}

}  // namespace

struct ResilientStep::State {
  State(const torch::nn::Module& model, const ResilientStepOptions& options)
      : options(options),
        parameters(parameters_of(model)),
        versions(versions_of(parameters)),
        start(model, parameters) {}
  ResilientStepOptions options;
  std::vector<at::Tensor> parameters;
  std::vector<uint32_t> versions;
  StepStart start;
  StepAttempt attempt;
  std::string held;  // what each failed run held, for the error that passes on
};

ResilientStep::ResilientStep(const torch::nn::Module& model, const ResilientStepOptions& options) {
  TORCH_CHECK(options.max_attempts() >= 1,
              "ckpt::resilient_step: max_attempts must be at least 1, but got ",
              options.max_attempts(), ".");
  state_ = std::make_unique<State>(model, options);
}

ResilientStep::~ResilientStep() = default;

const StepAttempt& ResilientStep::attempt() const {
  return state_->attempt;
}

bool ResilientStep::recover(c10::OutOfMemoryError& error) {
  State& s = *state_;
  const std::optional<int64_t> held = s.start.held_bytes();
  s.held += c10::str(s.held.empty() ? "" : ", ", held ? std::to_string(*held) + " bytes" : "?");
  if (versions_of(s.parameters) != s.versions) {
    error.add_context(
        "ckpt::resilient_step: the step changed parameters in place before it ran out of memory "
        "(an optimizer step inside it?), so it can't run again from where it started. Call "
        "optimizer.step() after resilient_step returns.");
    return false;
  }
  if (s.attempt.index + 1 >= s.options.max_attempts()) {
    error.add_context(
        c10::str("ckpt::resilient_step: the step ran out of device memory in each of "
                 "its ",
                 s.options.max_attempts(), " runs (held at their peaks: ", s.held,
                 "). Free device memory, keep less in the step, or allow more "
                 "attempts (ResilientStepOptions().max_attempts)."));
    return false;
  }
  s.start.rewind();
  s.attempt.index += 1;
  s.attempt.failed_peak_bytes = held;
  s.attempt.budget_bytes =
      held ? std::optional<int64_t>(*held - *held / 16) : std::optional<int64_t>();
  if (s.options.warn()) {
    TORCH_WARN("ckpt::resilient_step: the step ran out of device memory (", first_line(error),
               "); its state went back to the step's start and it runs again (attempt ",
               s.attempt.index + 1, " of ", s.options.max_attempts(), ", budget ",
               s.attempt.budget_bytes ? std::to_string(*s.attempt.budget_bytes) + " bytes"
                                      : std::string("unknown"),
               ").");
  }
  return true;
}

}  // namespace detail
}  // namespace ckpt
