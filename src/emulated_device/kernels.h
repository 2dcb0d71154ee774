#pragma once

// The operators the emulated accelerator implements itself; every other one runs through the CPU
// fallback (fallback.h).

namespace ckpt {
namespace emulated_device {
namespace detail {

/// Registers the kernels and the fallback for PrivateUse1 (once; kept for the process).
void register_kernels();

}  // namespace detail
}  // namespace emulated_device
}  // namespace ckpt
