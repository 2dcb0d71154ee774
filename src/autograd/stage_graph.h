#pragma once

// One stage of a chain run with grad on, with its autograd graph kept apart from everything
// before it, so that its backward can be run on its own (the executor's Fall and B operations).

#include "graph.h"
#include "saved_tensor_hooks.h"

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/edge.h>
#include <torch/csrc/autograd/function.h>
#include <torch/nn/modules/container/any.h>

#include <functional>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace ckpt {
namespace detail {

/// The gradients of the leaves (parameters, mostly) that a chain's stages reach in a plain
/// backward, summed over the stages. A parameter used by several stages (a tied weight) would
/// otherwise have its accumulator run once per stage, and hooks on it (a data-parallel reducer's)
/// would fire before its gradient is complete; the chain hands each sum to autograd once, at the
/// end of its backward. As everywhere in ckpt (`accumulate_sole_gradients_early`), a gradient
/// goes into an existing `.grad` at once only where it is the leaf's sole gradient in the
/// backward, and the accumulator still runs once after.
class LeafGradients {
 public:
  /// `single_stage_leaves`: the leaves exactly one stage of the chain uses (parameters of one
  /// stage's modules). Only their gradients may go into `.grad` early: a stage not yet
  /// recomputed holds no reference that would show another use.
  explicit LeafGradients(std::unordered_set<const c10::TensorImpl*> single_stage_leaves = {})
      : single_stage_leaves_(std::move(single_stage_leaves)) {}
  /// Adds `grad` to the sum for `edge`'s leaf (out of place: the engine's gradient may alias a
  /// tensor still in use).
  void add(const torch::autograd::Edge& edge, const at::Tensor& grad);
  /// Whether `leaf` is used by one stage of the chain only.
  bool single_stage(const at::Tensor& leaf) const {
    return leaf.defined() && single_stage_leaves_.count(leaf.unsafeGetTensorImpl()) != 0;
  }
  /// The sum for `accumulator`, removed (undefined when it got none, or was accumulated into).
  at::Tensor take(const torch::autograd::Node* accumulator);
  /// Runs the accumulators of the leaves not taken (tensors a stage captured) on their sums.
  void accumulate_rest();

 private:
  struct Slot {
    torch::autograd::Edge edge;
    at::Tensor sum;
  };
  std::unordered_map<const torch::autograd::Node*, Slot> slots_;
  std::unordered_set<const c10::TensorImpl*> single_stage_leaves_;
};

/// The leaves exactly one of `stages` uses (the parameters of one stage's modules), for
/// `LeafGradients`.
std::unordered_set<const c10::TensorImpl*> single_stage_leaves(
    const std::vector<torch::nn::AnyModule>& stages);

/// A stage's forward: its module run on its input, plainly or as a region.
using StageForward = std::function<at::Tensor(const at::Tensor&)>;

class StageGraph {
 public:
  /// Runs `forward` on a detached alias of `input` (a leaf that requires grad when
  /// `input_requires_grad`) and keeps the graph. A forward that runs the stage as a checkpointed
  /// region keeps its output (and what a selective policy saves) in the graph, and its backward
  /// recomputes the rest: the planner's storage modes (`ckpt::StorageMode`).
  StageGraph(const StageForward& forward, const at::Tensor& input, bool input_requires_grad);

  const at::Tensor& output() const { return output_; }

  /// Backward through the stage from `grad_output`; frees the graph and returns the gradient of
  /// the input (undefined when the input needs none). The gradients of parameters (and other
  /// leaves) go to `leaves`.
  at::Tensor backward(at::Tensor grad_output, LeafGradients& leaves);

  /// The same inside `autograd::grad`: only the input's gradient is computed.
  at::Tensor input_gradient(at::Tensor grad_output);

 private:
  void release();

  RegionMarker marker_;          // taken before the stage runs: its nodes are those created after
  SavedLeafTally saved_leaves_;  // the leaves its forward saved under ckpt's hooks
  at::Tensor leaf_;
  at::Tensor output_;
  Boundary boundary_;
};

}  // namespace detail
}  // namespace ckpt
