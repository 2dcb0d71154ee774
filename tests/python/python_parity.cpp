// Writes the inputs, weights and ckpt's gradients of a small computation with dropout, for
// parity.py to redo with Python's torch.utils.checkpoint and compare bit for bit.

#include <ckpt/checkpoint.h>

#include <ATen/ATen.h>
#include <torch/nn/functional/dropout.h>
#include <torch/utils.h>

#include <fstream>
#include <iostream>
#include <map>
#include <string>

namespace {

void write(const std::string& dir, const std::string& name, const at::Tensor& t) {
  auto contiguous = t.contiguous().to(at::kFloat);
  std::ofstream out(dir + "/" + name + ".bin", std::ios::binary);
  out.write(static_cast<const char*>(contiguous.data_ptr()),
            static_cast<std::streamsize>(contiguous.numel() * sizeof(float)));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: python_parity OUT_DIR\n";
    return 2;
  }
  const std::string dir = argv[1];
  torch::manual_seed(0);
  std::map<std::string, at::Tensor> tensors = {
      {"x", torch::randn({8, 16})},   {"w1", torch::randn({32, 16})}, {"b1", torch::randn({32})},
      {"w2", torch::randn({16, 32})}, {"b2", torch::randn({16})},
  };
  for (auto& [name, t] : tensors) {
    t.requires_grad_();
    write(dir, name, t);
  }
  auto fn = [&](const at::Tensor& x) {
    auto h = at::linear(x, tensors["w1"], tensors["b1"]).tanh();
    h = at::dropout(h, 0.5, /*train=*/true);
    return at::linear(h, tensors["w2"], tensors["b2"]);
  };
  for (bool reentrant : {true, false}) {
    for (auto& [name, t] : tensors) t.mutable_grad() = at::Tensor();
    torch::manual_seed(123);
    auto y = ckpt::checkpoint(ckpt::CheckpointOptions().use_reentrant(reentrant), fn, tensors["x"]);
    y.pow(2).sum().backward();
    const std::string prefix = reentrant ? "reentrant_" : "non_reentrant_";
    write(dir, prefix + "y", y.detach());
    for (auto& [name, t] : tensors) write(dir, prefix + "grad_" + name, t.grad());
  }
  std::cout << "wrote " << dir << "\n";
  return 0;
}
