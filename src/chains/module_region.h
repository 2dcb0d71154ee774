#pragma once

// A checkpointed region over modules, whose buffers a recompute must not update again.

#include <ckpt/options.h>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <vector>

namespace ckpt {
namespace detail {

/// Runs `fn(input)` as a checkpointed region in which a recompute leaves the buffers of `modules`
/// (BatchNorm statistics) as the forward left them.
at::Tensor checkpoint_modules(const CheckpointOptions& options,
                              const std::vector<std::shared_ptr<torch::nn::Module>>& modules,
                              std::function<at::Tensor(const at::Tensor&)> fn,
                              const at::Tensor& input);

}  // namespace detail
}  // namespace ckpt
