// Consumes ckpt::emulated_device from the installed package: a training step on device 1.

#include <ckpt/emulated_device.h>

#include <torch/nn/modules/linear.h>

#include <iostream>

int main() {
  ckpt::emulated_device::install(2);
  const auto device = ckpt::emulated_device::device(1);
  torch::nn::Linear model(4, 2);
  model->to(device);
  model(torch::ones({3, 4}, torch::TensorOptions().device(device))).sum().backward();
  if (model->weight.grad().device() != device) return 1;
  std::cout << "ckpt::emulated_device: a step on " << device << ", peak "
            << ckpt::emulated_device::memory_stats(1).peak_allocated_bytes << " bytes\n";
  return 0;
}
