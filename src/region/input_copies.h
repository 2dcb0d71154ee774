#pragma once

// Tensor arguments that a checkpointed function writes into in place during its forward (an
// in-place ReLU on its input, say): the recompute must start from their values before the write.

#include "autograd/buffer_guard.h"

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/edge.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace ckpt {
namespace detail {

/// Copies of the arguments a call site writes into, taken before the function runs, with the
/// gradient edges the arguments had then. An argument that is a view of another tensor (a
/// planner's alias, a slice) is kept as a copy of its base and its place in it: a write into a
/// view goes to its base in the forward's graph (CopySlices), so the recompute writes into a view
/// of the base's copy, made inside the recompute, and its graph leads where the forward's did.
class InputCopies {
 public:
  InputCopies() = default;
  /// Copies the inputs whose bit is set in `written` (one copy of each, kept until the backward).
  InputCopies(const std::vector<at::Tensor>& inputs, uint64_t written);

  bool empty() const { return copies_.empty(); }
  bool copied(size_t i) const { return i < copies_.size() && copies_[i].defined(); }
  /// What is kept for argument i: its copy, or its base's (undefined where not copied).
  const at::Tensor& kept(size_t i) const { return copies_.at(i); }
  /// A fresh tensor with argument i's value before the write, for one recompute to write into:
  /// with its gradient edge then (the non-reentrant recompute's graph leads where the forward's
  /// did), or detached and requiring grad as the argument did (the reentrant variant's).
  at::Tensor fresh(size_t i, bool with_history) const;
  void clear();

 private:
  // Where a copied argument lies in its base's copy.
  struct Place {
    std::vector<int64_t> sizes, strides;
    int64_t offset = 0;  // in elements, from the base's first
  };
  at::Tensor value_of(size_t i) const;

  std::vector<at::Tensor> copies_;  // undefined where not copied; a base's copy for a view
  std::vector<torch::autograd::Edge> edges_;  // the argument's, or for a view its base's
  std::vector<bool> required_grad_;
  std::vector<std::optional<Place>> places_;  // set for the views kept through their base
};

}  // namespace detail
}  // namespace ckpt
