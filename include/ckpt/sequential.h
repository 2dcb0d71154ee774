#pragma once

#include <ckpt/options.h>

#include <ATen/core/Tensor.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace ckpt {

/// Runs a chain of functions in `segments` segments, all but the last checkpointed, like Python's
/// `torch.utils.checkpoint.checkpoint_sequential`.
///
/// The chain is cut into segments of `n / segments` functions (integer division); the first
/// `segments - 1` run as checkpointed regions and the rest of the chain runs normally. Both
/// variants are available through `options`, and RNG state is preserved per segment.
///
/// Differences from PyTorch: `segments` greater than the number of functions is clamped to it
/// (PyTorch 1.13 fails with an unrelated `ValueError`), and buffers of the chain's modules (the
/// running statistics of BatchNorm) are updated once per step, not again by the recompute
/// (pytorch/pytorch#96136). Functions given as `std::function` have no buffers ckpt can see: use
/// `ckpt::is_recomputing()` inside them to skip side effects.
///
/// Example:
/// ```
/// auto y = ckpt::checkpoint_sequential(model, /*segments=*/4, x);
/// ```
torch::Tensor checkpoint_sequential(const torch::nn::Sequential& functions, int64_t segments,
                                    const torch::Tensor& input,
                                    const CheckpointOptions& options = {});

/// `checkpoint_sequential` over a list of modules.
torch::Tensor checkpoint_sequential(const std::vector<torch::nn::AnyModule>& functions,
                                    int64_t segments, const torch::Tensor& input,
                                    const CheckpointOptions& options = {});

/// `checkpoint_sequential` over a list of functions.
torch::Tensor checkpoint_sequential(
    const std::vector<std::function<torch::Tensor(torch::Tensor)>>& functions, int64_t segments,
    const torch::Tensor& input, const CheckpointOptions& options = {});

}  // namespace ckpt
