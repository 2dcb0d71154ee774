#pragma once

// Small Linear stages for the chain planner's exactness tests.

#include <torch/torch.h>

namespace ckpt {
namespace test {

// A stage that uses its weight twice: Linear(width, width) with its weight divided by the
// weight's norm (weight normalisation), then tanh. Its backward hands the weight two gradients,
// which autograd sums before adding them into `.grad`.
struct NormalisedLinearImpl : torch::nn::Module {
  explicit NormalisedLinearImpl(int64_t width)
      : linear(register_module("linear", torch::nn::Linear(width, width))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    const torch::Tensor& weight = linear->weight;
    return torch::tanh(torch::nn::functional::linear(x, weight / weight.norm(), linear->bias));
  }
  torch::nn::Linear linear;
};
TORCH_MODULE(NormalisedLinear);

// tanh(Linear(width, width)(x)) as one stage.
struct LinearTanhImpl : torch::nn::Module {
  explicit LinearTanhImpl(int64_t width)
      : linear(register_module("linear", torch::nn::Linear(width, width))) {}
  torch::Tensor forward(const torch::Tensor& x) { return torch::tanh(linear(x)); }
  torch::nn::Linear linear;
};
TORCH_MODULE(LinearTanh);

}  // namespace test
}  // namespace ckpt
