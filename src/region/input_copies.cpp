#include "input_copies.h"

#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/variable.h>

namespace ckpt {
namespace detail {

InputCopies::InputCopies(const std::vector<at::Tensor>& inputs, uint64_t written) {
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!(written & written_input_bit(i)) || !inputs[i].defined()) continue;
    if (copies_.empty()) {
      copies_.resize(inputs.size());
      edges_.resize(inputs.size());
      required_grad_.resize(inputs.size());
    }
    const at::NoGradGuard no_grad;
    copies_[i] = inputs[i].detach().clone();
    required_grad_[i] = inputs[i].requires_grad();
    if (inputs[i].requires_grad()) edges_[i] = torch::autograd::impl::gradient_edge(inputs[i]);
  }
}

at::Tensor InputCopies::fresh(size_t i, bool with_history) const {
  at::Tensor copy;
  {
    const at::NoGradGuard no_grad;
    copy = copies_[i].clone();
  }
  if (!required_grad_[i]) return copy;
  if (!with_history) return copy.requires_grad_(true);
  torch::autograd::impl::set_gradient_edge(copy, edges_[i]);
  return copy;
}

void InputCopies::clear() {
  copies_.clear();
  edges_.clear();
  required_grad_.clear();
}

}  // namespace detail
}  // namespace ckpt
