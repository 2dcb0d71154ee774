#pragma once

// One stage of a chain run with grad on, with its autograd graph kept apart from everything
// before it, so that its backward can be run on its own (the executor's Fall and B operations).

#include <ckpt/options.h>

#include "region/graph.h"

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/edge.h>
#include <torch/csrc/autograd/function.h>
#include <torch/nn/modules/container/any.h>

#include <functional>
#include <unordered_map>

namespace ckpt {
namespace detail {

/// The gradients of the leaves (parameters, mostly) that a chain's stages reach in a plain
/// backward, summed over the stages. A parameter used by several stages (a tied weight) would
/// otherwise have its accumulator run once per stage, and hooks on it (a data-parallel reducer's)
/// would fire before its gradient is complete; the chain hands each sum to autograd once, at the
/// end of its backward. As in a checkpointed region, a gradient buffer that exists already is
/// accumulated into at once (no second buffer), and the accumulator still runs once after.
class LeafGradients {
 public:
  void add(const torch::autograd::Edge& edge, const at::Tensor& grad);
  /// The sum for `accumulator`, removed (undefined when it got none, or was accumulated into).
  at::Tensor take(const torch::autograd::Node* accumulator);
  /// Runs the accumulators of the leaves not taken (tensors a stage captured) on their sums.
  void accumulate_rest();

 private:
  struct Slot {
    torch::autograd::Edge edge;
    std::function<void(const at::Tensor&)> early;
    at::Tensor sum;
  };
  std::unordered_map<const torch::autograd::Node*, Slot> slots_;
};

class StageGraph {
 public:
  /// Runs `stage` on a detached alias of `input` (a leaf that requires grad when
  /// `input_requires_grad`) and keeps the graph. With `region` the stage runs as a checkpointed
  /// region with those options: the graph keeps its output (and what a selective policy saves),
  /// and its backward recomputes the rest (the planner's "checkpointed" and "selective" storage
  /// options).
  StageGraph(torch::nn::AnyModule& stage, const at::Tensor& input, bool input_requires_grad,
             const CheckpointOptions* region = nullptr);

  const at::Tensor& output() const { return output_; }

  /// Backward through the stage from `grad_output`; frees the graph and returns the gradient of
  /// the input (undefined when the input needs none). With `accumulate_parameters` (a plain
  /// backward) the gradients of parameters are accumulated into their `.grad` as autograd does;
  /// otherwise (inside `autograd::grad`) only the input's gradient is computed.
  at::Tensor backward(at::Tensor grad_output, bool accumulate_parameters);

  /// The same, with the gradients of parameters (and other leaves) added to `leaves` instead.
  at::Tensor backward(at::Tensor grad_output, LeafGradients& leaves);

 private:
  void release();

  RegionMarker marker_;  // taken before the stage runs: its nodes are those created after
  at::Tensor leaf_;
  at::Tensor output_;
  Boundary boundary_;
};

}  // namespace detail
}  // namespace ckpt
