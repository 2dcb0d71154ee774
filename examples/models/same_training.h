#pragma once

// What every example checks: two copies of a model, trained side by side from the same start,
// one plain and one checkpointed, stay identical to the bit: losses, every gradient, every
// parameter and every buffer (BatchNorm's statistics included). Each runs on the CPU, or on the
// device its first argument names: `emulated[:N]` (ckpt's emulated accelerator) or `cuda[:N]`.

#include "device_option.h"  // models/: the device parser of the `ckpt` program and the benchmarks

#include <torch/torch.h>

#include <cstdlib>
#include <iostream>
#include <stdexcept>
#include <string>

namespace examples {

/// The device the program's first argument names (the CPU without one), read as the `ckpt`
/// program reads --device: cpu, cuda[:N] or emulated[:N]; `emulated` installs ckpt's emulated
/// accelerator first, on any LibTorch (the examples need none of what 2.9 added). A device this
/// machine or LibTorch doesn't have ends the program with exit code 2.
inline torch::Device device_from_arguments(int argc, char** argv) {
  const std::string name = argc > 1 ? argv[1] : "cpu";
  try {
    return ckpt::models::parse_device(name, "the device argument",
                                      ckpt::models::EmulatedNeeds::kDevicesOnly);
  } catch (const std::invalid_argument& error) {
    std::cerr << argv[0] << ": " << error.what() << "\n";
    std::exit(2);
  }
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
