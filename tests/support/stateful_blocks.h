#pragma once

// A block that writes into a buffer in its forward and then reads it: Linear(width, width), a
// running average of its output kept as a buffer of the output's shape, updated in training, then
// tanh of the output less that average, gated by the output's sigmoid. A recompute must read the average as its forward did,
// before the update (docs/memory-model.md, "Buffers"); the buffer, an activation's size, weighs
// in the planners' models.

#include <torch/torch.h>

namespace ckpt {
namespace test {

struct SmoothingBlockImpl : torch::nn::Module {
  SmoothingBlockImpl(int64_t batch, int64_t width)
      : linear(register_module("linear", torch::nn::Linear(width, width))),
        average(register_buffer("average", torch::zeros({batch, width}))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h = linear(x);
    if (is_training()) {
      const torch::NoGradGuard no_grad;
      average.mul_(0.75).add_(h, 0.25);
    }
    return torch::tanh(h - average) * torch::sigmoid(h);
  }
  torch::nn::Linear linear;
  torch::Tensor average;
};
TORCH_MODULE(SmoothingBlock);

}  // namespace test
}  // namespace ckpt
