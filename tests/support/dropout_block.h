#pragma once

// A block that draws random numbers in every forward (Linear(64, 64), Dropout(0.2), tanh): the
// random state a planned step keeps for it is what the planners' models must count
// (docs/memory-model.md, "Random state").

#include <torch/torch.h>

namespace ckpt {
namespace test {

struct DropoutBlockImpl : torch::nn::Module {
  DropoutBlockImpl()
      : linear(register_module("linear", torch::nn::Linear(64, 64))),
        dropout(register_module("dropout", torch::nn::Dropout(0.2))) {}
  torch::Tensor forward(const torch::Tensor& x) { return torch::tanh(dropout(linear(x))); }
  torch::nn::Linear linear;
  torch::nn::Dropout dropout;
};
TORCH_MODULE(DropoutBlock);

}  // namespace test
}  // namespace ckpt
