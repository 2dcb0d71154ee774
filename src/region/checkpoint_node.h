#pragma once

// The autograd nodes that stand for a checkpointed region in the graph.

#include "compat/torch_compat.h"
#include "graph.h"
#include "region_state.h"

#include <torch/csrc/autograd/function.h>

#include <memory>
#include <string>

namespace ckpt {
namespace detail {

using torch::autograd::variable_list;

/// Non-reentrant: its next edges are the edges by which the region's graph left the region
/// (inputs, captured tensors, parameters). Backward recomputes the region with grad on, runs the
/// engine on the fresh graph up to those edges, and hands their gradients on.
class NonReentrantBackward final : public compat::OwningNode {
 public:
  NonReentrantBackward(std::shared_ptr<RegionState> state, Boundary boundary);
  variable_list apply(variable_list&& grads) override;
  void release_variables() override;
  std::string name() const override { return "ckpt::CheckpointBackward"; }
  /// An enclosing region's backward, which redirected next edge k to itself, adds the gradient
  /// of that edge's leaf into `.grad` as soon as it arrives (it is the leaf's one input): this
  /// node may add it early itself. Set before the enclosing engine run, read during it.
  void mark_sole_through_enclosing(size_t k);

 private:
  void release_owned() override {
    state_.reset();
    boundary_ = Boundary();
  }
  void accumulate_sole_gradients_early(BorderCapture& border, const std::vector<size_t>& needed);

  std::shared_ptr<RegionState> state_;
  // A copy of the next edges as created: an enclosing region's recompute may redirect them.
  Boundary boundary_;
  std::vector<bool> sole_through_enclosing_;
};

/// Reentrant: its next edges are the gradient edges of the tensor arguments. Backward recomputes
/// on detached copies of the arguments and runs a nested backward, which accumulates the
/// gradients of captured parameters directly (as Python's reentrant checkpoint does).
class ReentrantBackward final : public compat::OwningNode {
 public:
  ReentrantBackward(std::shared_ptr<RegionState> state, edge_list input_edges);
  variable_list apply(variable_list&& grads) override;
  void release_variables() override;
  std::string name() const override { return "ckpt::CheckpointBackward(reentrant)"; }

 private:
  void release_owned() override { state_.reset(); }

  std::shared_ptr<RegionState> state_;
};

}  // namespace detail
}  // namespace ckpt
