#include "input_copies.h"

#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/variable.h>

namespace ckpt {
namespace detail {
namespace {

// A tensor with the sizes and strides of `t` and a copy of its elements.
at::Tensor copy_with_strides(const at::Tensor& t) {
  at::Tensor copy = at::empty_strided(t.sizes(), t.strides(), t.options());
  copy.copy_(t);
  return copy;
}

// Whether `t` is a view that autograd differentiates through, of a base whose copy can keep the
// base's strides (no element twice in memory, no gaps), so that the view's place carries over.
bool kept_through_base(const at::Tensor& t) {
  return t.requires_grad() && t.is_view() && t._base().defined() &&
         t._base().is_non_overlapping_and_dense();
}

}  // namespace

InputCopies::InputCopies(const std::vector<at::Tensor>& inputs, uint64_t written) {
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!(written & site_bit(i)) || !inputs[i].defined()) continue;
    if (copies_.empty()) {
      copies_.resize(inputs.size());
      edges_.resize(inputs.size());
      required_grad_.resize(inputs.size());
      places_.resize(inputs.size());
    }
    const at::Tensor& input = inputs[i];
    const at::NoGradGuard no_grad;
    required_grad_[i] = input.requires_grad();
    if (kept_through_base(input)) {
      const at::Tensor base(input._base());
      copies_[i] = copy_with_strides(base.detach());
      edges_[i] = torch::autograd::impl::gradient_edge(base);
      places_[i] = Place{input.sizes().vec(), input.strides().vec(),
                         input.storage_offset() - base.storage_offset()};
      continue;
    }
    copies_[i] = input.detach().clone();
    if (input.requires_grad()) edges_[i] = torch::autograd::impl::gradient_edge(input);
  }
}

// Argument i's value before the write: its copy, or its place in its base's copy.
at::Tensor InputCopies::value_of(size_t i) const {
  if (!places_[i]) return copies_[i];
  const Place& place = *places_[i];
  return copies_[i].as_strided(place.sizes, place.strides,
                               copies_[i].storage_offset() + place.offset);
}

at::Tensor InputCopies::fresh(size_t i, bool with_history) const {
  if (places_[i] && with_history) {
    at::Tensor base;
    {
      const at::NoGradGuard no_grad;
      base = copy_with_strides(copies_[i]);
    }
    torch::autograd::impl::set_gradient_edge(base, edges_[i]);
    const Place& place = *places_[i];
    // Under grad mode, so that a write into it goes to the base's graph as in the forward.
    const at::AutoGradMode grad_mode(true);
    return base.as_strided(place.sizes, place.strides, base.storage_offset() + place.offset);
  }
  at::Tensor copy;
  {
    const at::NoGradGuard no_grad;
    copy = value_of(i).clone();
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
  places_.clear();
}

}  // namespace detail
}  // namespace ckpt
