#include "joined_stages.h"

#include "autograd/buffer_guard.h"
#include "autograd/outside_state.h"
#include "autograd/rng_state.h"

#include <ATen/core/grad_mode.h>
#include <torch/nn/module.h>

#include <string>
#include <utility>

namespace ckpt {
namespace detail {
namespace {

// Stages run one after another as one stage.
class JoinedStagesImpl : public torch::nn::Module {
 public:
  explicit JoinedStagesImpl(std::vector<torch::nn::AnyModule> stages) : stages_(std::move(stages)) {
    for (size_t i = 0; i < stages_.size(); ++i)
      register_module(std::to_string(i), stages_[i].ptr());
  }
  at::Tensor forward(const at::Tensor& input) {
    at::Tensor x = input;
    for (auto& stage : stages_) x = stage.forward<at::Tensor>(x);
    return x;
  }

 private:
  std::vector<torch::nn::AnyModule> stages_;
};

// A first stage that writes into the chain's input runs on a copy: the input is x_0 of every
// recompute of it (the caller's tensor is left as it was).
class OnInputCopyImpl : public torch::nn::Module {
 public:
  explicit OnInputCopyImpl(torch::nn::AnyModule stage) : stage_(std::move(stage)) {
    register_module("0", stage_.ptr());
  }
  at::Tensor forward(const at::Tensor& input) { return stage_.forward<at::Tensor>(input.clone()); }

 private:
  torch::nn::AnyModule stage_;
};

std::vector<bool> writes_into_input(const std::vector<torch::nn::AnyModule>& stages,
                                    const at::Tensor& sample) {
  std::vector<std::shared_ptr<torch::nn::Module>> modules;
  for (const auto& stage : stages) modules.push_back(stage.ptr());
  const BufferGuard buffers(modules);
  const RngRestore put_back({sample}, infer_device_type({sample}));
  const at::NoGradGuard no_grad;
  std::vector<bool> writes;
  at::Tensor x = sample.detach().clone();
  // State the stages write without registering it goes back too (the profiler refuses them).
  OutsideStateWatch outside({x}, modules);
  const DispatchModeGuard watching(outside);
  for (auto stage : stages) {
    const int64_t version = x._version();
    at::Tensor y = stage.forward<at::Tensor>(x);
    writes.push_back(x._version() != version);
    x = std::move(y);
  }
  return writes;
}

}  // namespace

std::vector<torch::nn::AnyModule> stages_to_plan(const std::vector<torch::nn::AnyModule>& stages,
                                                 const at::Tensor& sample) {
  const std::vector<bool> writes = writes_into_input(stages, sample);
  std::vector<std::vector<torch::nn::AnyModule>> groups;
  for (size_t i = 0; i < stages.size(); ++i) {
    if (i == 0 || !writes[i]) groups.emplace_back();
    groups.back().push_back(stages[i]);
  }
  std::vector<torch::nn::AnyModule> planned;
  for (auto& group : groups) {
    planned.push_back(group.size() == 1 ? group.front()
                                        : torch::nn::AnyModule(JoinedStagesImpl(std::move(group))));
  }
  if (writes[0]) planned[0] = torch::nn::AnyModule(OnInputCopyImpl(planned[0]));
  return planned;
}

}  // namespace detail
}  // namespace ckpt
