// Entry point of the device tests: installs the emulated accelerator before any test runs (the
// autograd engine starts its device threads at the first backward pass of the process), unless
// a CUDA device is present where LibTorch would take the emulated accelerator for the process's
// accelerator (install() refuses then): there the CUDA instances run and the emulated ones skip.

#include <ckpt/emulated_device.h>

#include <gtest/gtest.h>
#include <torch/cuda.h>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (!(ckpt::emulated_device::has_accelerator_hooks() && torch::cuda::is_available())) {
    ckpt::emulated_device::install(2);
  }
  return RUN_ALL_TESTS();
}
