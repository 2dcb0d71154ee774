#pragma once

// A custom operator whose CPU kernel counts its calls: `ckpt_test::counted_scale`, y = 2x, with
// its own autograd formula, which saves nothing. Tests count how often a recompute runs it.

#include <ATen/core/Tensor.h>

#include <atomic>

namespace ckpt {
namespace test {

/// Calls of the operator's CPU kernel since the test last reset it.
extern std::atomic<int> scale_kernel_calls;

/// y = 2x through the counted operator, differentiable (the gradient is 2 times y's).
at::Tensor counted_scale(const at::Tensor& x);

}  // namespace test
}  // namespace ckpt
