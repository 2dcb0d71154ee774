#include "recurrent.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/zeros_like.h>

#include <tuple>

namespace ckpt {
namespace emulated_device {
namespace detail {
namespace {

// The cells compose device operators (each runs through the fallback on the device's memory),
// with the arithmetic of LibTorch's CUDA kernels: gates are added before the biases, and the
// workspace holds what the backward needs, laid out as CUDA's is.

bool defined(const c10::optional<at::Tensor>& tensor) {
  return tensor.has_value() && tensor->defined();
}

// Returns (hy, cy, workspace), the workspace holding the activated gates [i, f, g, o].
std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_cell(
    const at::Tensor& input_gates, const at::Tensor& hidden_gates, const at::Tensor& cx,
    const c10::optional<at::Tensor>& input_bias, const c10::optional<at::Tensor>& hidden_bias) {
  at::Tensor sum = input_gates + hidden_gates;
  if (defined(input_bias)) sum = sum + *input_bias + *hidden_bias;
  const auto gates = sum.chunk(4, 1);
  const at::Tensor i = gates[0].sigmoid(), f = gates[1].sigmoid();
  const at::Tensor g = gates[2].tanh(), o = gates[3].sigmoid();
  at::Tensor cy = f * cx + i * g;
  at::Tensor hy = o * cy.tanh();
  return {std::move(hy), std::move(cy), at::cat({i, f, g, o}, 1)};
}

// Returns (the gates' gradient, cx's, the bias's where `has_bias`).
std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_cell_backward(
    const c10::optional<at::Tensor>& grad_hy, const c10::optional<at::Tensor>& grad_cy,
    const at::Tensor& cx, const at::Tensor& cy, const at::Tensor& workspace, bool has_bias) {
  if (!defined(grad_hy) && !defined(grad_cy)) return {};
  const auto gates = workspace.chunk(4, 1);
  const at::Tensor &i = gates[0], &f = gates[1], &g = gates[2], &o = gates[3];
  const at::Tensor tanh_cy = cy.tanh();
  const at::Tensor grad_h = defined(grad_hy) ? *grad_hy : at::zeros_like(cy);
  at::Tensor grad_c = grad_h * o * (1 - tanh_cy * tanh_cy);
  if (defined(grad_cy)) grad_c = grad_c + *grad_cy;
  at::Tensor grad_gates = at::cat({grad_c * g * (1 - i) * i, grad_c * cx * (1 - f) * f,
                                   grad_c * i * (1 - g * g), grad_h * tanh_cy * (1 - o) * o},
                                  1);
  at::Tensor grad_bias = has_bias ? grad_gates.sum(0) : at::Tensor();
  return {std::move(grad_gates), grad_c * f, std::move(grad_bias)};
}

// Returns (hy, workspace), the workspace holding [r, z, n, hx, the hidden new gate with its bias].
std::tuple<at::Tensor, at::Tensor> gru_cell(const at::Tensor& input_gates,
                                            const at::Tensor& hidden_gates, const at::Tensor& hx,
                                            const c10::optional<at::Tensor>& input_bias,
                                            const c10::optional<at::Tensor>& hidden_bias) {
  const auto in = input_gates.chunk(3, 1);
  const auto hidden = hidden_gates.chunk(3, 1);
  at::Tensor r_pre = in[0] + hidden[0], z_pre = in[1] + hidden[1];
  at::Tensor n_in = in[2], n_hidden = hidden[2];
  if (defined(input_bias)) {
    const auto b1 = input_bias->chunk(3), b2 = hidden_bias->chunk(3);
    r_pre = r_pre + b1[0] + b2[0];
    z_pre = z_pre + b1[1] + b2[1];
    n_in = n_in + b1[2];
    n_hidden = n_hidden + b2[2];
  }
  const at::Tensor r = r_pre.sigmoid(), z = z_pre.sigmoid();
  const at::Tensor n = (n_in + r * n_hidden).tanh();
  at::Tensor hy = n + z * (hx - n);
  return {std::move(hy), at::cat({r, z, n, hx, n_hidden}, 1)};
}

// Returns the gradients of (input gates, hidden gates, hx, input bias, hidden bias).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> gru_cell_backward(
    const at::Tensor& grad_hy, const at::Tensor& workspace, bool has_bias) {
  const auto saved = workspace.chunk(5, 1);
  const at::Tensor &r = saved[0], &z = saved[1], &n = saved[2], &hx = saved[3];
  const at::Tensor& n_hidden = saved[4];
  const at::Tensor grad_z = grad_hy * (hx - n) * (1 - z) * z;
  const at::Tensor grad_n = grad_hy * (1 - z) * (1 - n * n);
  const at::Tensor grad_r = grad_n * n_hidden * (1 - r) * r;
  at::Tensor grad_input_gates = at::cat({grad_r, grad_z, grad_n}, 1);
  at::Tensor grad_hidden_gates = at::cat({grad_r, grad_z, grad_n * r}, 1);
  at::Tensor grad_input_bias, grad_hidden_bias;
  if (has_bias) {
    grad_input_bias = grad_input_gates.sum(0);
    grad_hidden_bias = grad_hidden_gates.sum(0);
  }
  return {std::move(grad_input_gates), std::move(grad_hidden_gates), grad_hy * z,
          std::move(grad_input_bias), std::move(grad_hidden_bias)};
}

}  // namespace

void register_recurrent_kernels(torch::Library& kernels) {
  kernels.impl("_thnn_fused_lstm_cell", TORCH_FN(lstm_cell));
  kernels.impl("_thnn_fused_lstm_cell_backward_impl", TORCH_FN(lstm_cell_backward));
  kernels.impl("_thnn_fused_gru_cell", TORCH_FN(gru_cell));
  kernels.impl("_thnn_fused_gru_cell_backward", TORCH_FN(gru_cell_backward));
}

}  // namespace detail
}  // namespace emulated_device
}  // namespace ckpt
