#pragma once

// A checkpointed region over modules: its border is the input and the modules' parameters.

#include <ckpt/options.h>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <vector>

namespace ckpt {
namespace detail {

/// Runs `fn(input)` as a checkpointed region that reads no tensor requiring grad other than
/// `input` and the parameters of `modules`: the non-reentrant forward runs without grad (see
/// `Region`), and a recompute leaves the modules' buffers as the forward left them.
at::Tensor checkpoint_modules(const CheckpointOptions& options,
                              const std::vector<std::shared_ptr<torch::nn::Module>>& modules,
                              std::function<at::Tensor(const at::Tensor&)> fn,
                              const at::Tensor& input);

}  // namespace detail
}  // namespace ckpt
