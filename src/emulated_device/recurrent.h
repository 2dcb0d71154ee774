#pragma once

// The fused recurrent cells: LibTorch runs an LSTM or GRU cell on every backend but the CPU as one
// fused operator, whose only kernels are CUDA's.

#include <torch/library.h>

namespace ckpt {
namespace emulated_device {
namespace detail {

/// Registers the fused LSTM and GRU cells, forward and backward, for PrivateUse1 in `kernels`.
void register_recurrent_kernels(torch::Library& kernels);

}  // namespace detail
}  // namespace emulated_device
}  // namespace ckpt
