// The errors of ckpt::emulated_device::install() that need a process of their own.
//   install_errors held      another backend registered a device guard for PrivateUse1 first
//   install_errors late      a backward pass ran before install(), without a thread for device 15
// Prints the error and exits 0 when it says what the mode expects; exits 1 otherwise.

#include <ckpt/emulated_device.h>

#include <ATen/ops/ones.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/autograd/autograd.h>

#include <iostream>
#include <string>

namespace {

int expect_error(int devices, const std::string& expected) {
  try {
    ckpt::emulated_device::install(devices);
  } catch (const c10::Error& error) {
    const std::string message = error.what_without_backtrace();
    std::cout << message << "\n";
    return message.find(expected) != std::string::npos ? 0 : 1;
  }
  std::cout << "install() raised no error\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "held") {
    // Stands for another library's PrivateUse1 backend.
    static c10::impl::DeviceGuardImplRegistrar other(
        c10::DeviceType::PrivateUse1,
        new c10::impl::NoOpDeviceGuardImpl<c10::DeviceType::PrivateUse1>());
    return expect_error(2, "another backend holds c10::DeviceType::PrivateUse1");
  }
  if (mode == "late") {
    torch::autograd::backward({at::ones({2}).set_requires_grad(true).sum()});
    // However many GPUs this machine has, the engine started fewer threads than 16.
    return expect_error(16, "Call install() before any backward pass");
  }
  std::cerr << "usage: install_errors held|late\n";
  return 2;
}
