#pragma once

// Blocks whose forward writes into a buffer and then reads it: a recompute must read the buffer as
// its forward did, before the write (docs/memory-model.md, "Buffers").

#include <torch/torch.h>

namespace ckpt {
namespace test {

// Linear(width, width), a running average of its output kept as a buffer of the output's shape,
// updated in training, then tanh of the output less that average, gated by the output's sigmoid.
// The buffer, an activation's size, weighs in the planners' models.
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

// Linear(8, 8) scaled by a call counter it writes through `.data()`, whose version counter is
// not the buffer's: the write moves no version.
struct DataCounterImpl : torch::nn::Module {
  DataCounterImpl() : linear(register_module("linear", torch::nn::Linear(8, 8))) {
    count = register_buffer("count", torch::zeros({1}));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    count.data().add_(1);  // no version bump
    return torch::tanh(linear(x) * count);
  }
  torch::nn::Linear linear;
  torch::Tensor count;
};
TORCH_MODULE(DataCounter);

// Linear(8, 8) less the mean of a history of its outputs, which grows by a row in every
// training forward (`set_`: the buffer changes shape).
struct GrowingHistoryImpl : torch::nn::Module {
  GrowingHistoryImpl() : linear(register_module("linear", torch::nn::Linear(8, 8))) {
    history = register_buffer("history", torch::zeros({1, 8}));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h = linear(x);
    if (is_training()) {
      const torch::NoGradGuard no_grad;
      history.set_(torch::cat({history, h.mean(0, true)}));
    }
    return torch::tanh(h - history.mean(0));
  }
  torch::nn::Linear linear;
  torch::Tensor history;
};
TORCH_MODULE(GrowingHistory);

}  // namespace test
}  // namespace ckpt
