// A checkpointed region whose arguments are on a device type whose generators LibTorch doesn't give
// ckpt (the emulated device on LibTorch 1.13) warns once per process, saying what is lost and what
// to do; where LibTorch gives them (LibTorch 2), it says nothing and the dropout is replayed. A
// process of its own, for the "once". Exits 0 when it sees what it expects.

#include <ckpt/checkpoint.h>
#include <ckpt/emulated_device.h>

#include "compat/torch_compat.h"

#include <ATen/ops/dropout.h>
#include <ATen/ops/ones.h>

#include <iostream>
#include <string>
#include <vector>

namespace {

struct Warnings : ckpt::compat::MessageWarningHandler {
  void on_warning(const std::string& message) override { messages.push_back(message); }
  std::vector<std::string> messages;
};

}  // namespace

int main() {
  ckpt::emulated_device::install(1);
  const at::Tensor x =
      at::ones({64}, at::TensorOptions().device(ckpt::emulated_device::device(0))).requires_grad_();
  Warnings warnings;
  c10::WarningHandler* const previous = ckpt::compat::warning_handler();
  ckpt::compat::set_warning_handler(&warnings);
  for (int call = 0; call < 2; ++call) {
    const auto y =
        ckpt::checkpoint([](const at::Tensor& t) { return at::dropout(t, 0.5, true); }, x);
    y.sum().backward();
  }
  ckpt::compat::set_warning_handler(previous);
  int said = 0;
  for (const auto& message : warnings.messages) {
    std::cout << message << "\n";
    said += message.find("RNG state can't be preserved") != std::string::npos;
  }
  const int expected = ckpt::emulated_device::has_accelerator_hooks() ? 0 : 1;
  std::cout << "warned " << said << " time(s), expected " << expected << "\n";
  return said == expected ? 0 : 1;
}
