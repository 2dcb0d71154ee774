#pragma once

// What every example checks: two copies of a model, trained side by side from the same start,
// one plain and one checkpointed, stay identical to the bit: losses, every gradient, every
// parameter and every buffer (BatchNorm's statistics included). Each runs on the CPU, or on the
// device its first argument names: `emulated` (ckpt's emulated accelerator) or `cuda`.

#include <ckpt/emulated_device.h>

#include <torch/torch.h>

#include <iostream>
#include <string>

namespace examples {

/// The device the program's first argument names (the CPU without one); `emulated` installs ckpt's
/// emulated accelerator first.
inline torch::Device device_from_arguments(int argc, char** argv) {
  const std::string name = argc > 1 ? argv[1] : "cpu";
  if (name == "emulated") {
    ckpt::emulated_device::install(1);
    return ckpt::emulated_device::device(0);
  }
  return torch::Device(name);
}

/// Prints the first difference between `plain` and `checkpointed`; true when there is none.
inline bool same(const std::string& what, const torch::Tensor& plain,
                 const torch::Tensor& checkpointed) {
  if (plain.defined() != checkpointed.defined()) {
    std::cerr << what << ": defined in one run only\n";
    return false;
  }
  if (!plain.defined() || torch::equal(plain, checkpointed)) return true;
  std::cerr << what << " differs: largest difference "
            << (plain - checkpointed).abs().max().item<double>() << "\n";
  return false;
}

/// Compares parameters, their gradients and buffers, by name.
inline bool same_state(const torch::nn::Module& plain, const torch::nn::Module& checkpointed) {
  bool ok = true;
  const auto a = plain.named_parameters(), b = checkpointed.named_parameters();
  for (const auto& item : a) {
    const auto& other = b[item.key()];
    ok &= same(item.key(), item.value(), other);
    ok &= same(item.key() + ".grad", item.value().grad(), other.grad());
  }
  const auto c = plain.named_buffers(), d = checkpointed.named_buffers();
  for (const auto& item : c) ok &= same(item.key(), item.value(), d[item.key()]);
  return ok;
}

/// Copies the parameters and buffers of `from` into `to`: the two runs start from one state.
inline void copy_state(const torch::nn::Module& from, torch::nn::Module& to) {
  torch::NoGradGuard no_grad;
  const auto a = from.named_parameters(), b = to.named_parameters();
  for (const auto& item : a) b[item.key()].copy_(item.value());
  const auto c = from.named_buffers(), d = to.named_buffers();
  for (const auto& item : c) d[item.key()].copy_(item.value());
}

}  // namespace examples
