// Entry point of the device tests: installs the emulated accelerator before any test runs (the
// autograd engine starts its device threads at the first backward pass of the process).

#include <ckpt/emulated_device.h>

#include <gtest/gtest.h>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ckpt::emulated_device::install(2);
  return RUN_ALL_TESTS();
}
