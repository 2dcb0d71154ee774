#pragma once

// Stages that write into their input in place (ReLU(inplace), as in the standard ResNet stem)
// destroy the value a recompute of them, or the stage before, would need. They are planned and
// run together with the stage before them; a first stage runs on a copy of the chain's input.

#include <ATen/core/Tensor.h>
#include <torch/nn/modules/container/any.h>

#include <vector>

namespace ckpt {
namespace detail {

/// The stages to plan and run for `stages` on inputs like `sample`: each stage that writes into
/// its input joined to the one before it, a first one that does wrapped to run on a copy. Runs
/// the chain once without grad to see the writes (the RNG and the buffers are left as they were).
std::vector<torch::nn::AnyModule> stages_to_plan(const std::vector<torch::nn::AnyModule>& stages,
                                                 const at::Tensor& sample);

}  // namespace detail
}  // namespace ckpt
