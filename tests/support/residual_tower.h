#pragma once

// A small model for planning tests: four residual blocks, each two candidates marked in its own
// forward (widening with GELU, then narrowing with dropout), the residual connection outside them.
// Its candidates are "blocks.<i>.in" and "blocks.<i>.out".

#include <ckpt/candidate.h>

#include <torch/torch.h>

namespace ckpt {
namespace test {

struct ResidualBlockImpl : torch::nn::Module {
  torch::nn::Linear in{register_module("in", torch::nn::Linear(64, 256))};
  torch::nn::Linear out{register_module("out", torch::nn::Linear(256, 64))};
  torch::nn::Dropout dropout{register_module("dropout", torch::nn::Dropout(0.1))};
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = ckpt::candidate(
        *this, "in", [this](const torch::Tensor& t) { return torch::gelu(in(t)); }, x);
    return x + ckpt::candidate(
                   *this, "out", [this](const torch::Tensor& t) { return dropout(out(t)); }, h);
  }
};
TORCH_MODULE(ResidualBlock);

struct ResidualTowerImpl : torch::nn::Module {
  torch::nn::ModuleList blocks{register_module("blocks", torch::nn::ModuleList())};
  ResidualTowerImpl() {
    for (int i = 0; i < 4; ++i) blocks->push_back(ResidualBlock());
  }
  torch::Tensor forward(torch::Tensor x) {
    for (size_t i = 0; i < blocks->size(); ++i) x = blocks->ptr<ResidualBlockImpl>(i)->forward(x);
    return x;
  }
};
TORCH_MODULE(ResidualTower);

}  // namespace test
}  // namespace ckpt
