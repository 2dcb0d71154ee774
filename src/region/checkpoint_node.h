#pragma once

// The autograd nodes that stand for a checkpointed region in the graph.

#include "autograd/graph.h"
#include "compat/torch_compat.h"
#include "region_state.h"

#include <torch/csrc/autograd/function.h>

#include <memory>
#include <string>
#include <utility>

namespace ckpt {
namespace detail {

using torch::autograd::variable_list;

/// Non-reentrant: its next edges are the edges by which the region's graph left the region
/// (inputs, captured tensors, parameters). Backward recomputes the region with grad on, runs the
/// engine on the fresh graph up to those edges, and hands their gradients on.
class NonReentrantBackward final : public BorderNode {
 public:
  NonReentrantBackward(std::shared_ptr<RegionState> state, Boundary boundary);
  variable_list apply(variable_list&& grads) override;
  void release_variables() override;
  std::string name() const override { return "ckpt::CheckpointBackward"; }

 private:
  variable_list backward(variable_list&& grads);
  void release_owned() override {
    state_.reset();
    boundary_ = Boundary();
    forwarded_.reset();
  }
  long sole_holders(size_t k) const;
  std::shared_ptr<const RecomputedGraph> recompute(bool two_passes, bool last) const;
  void take_edges(RecomputedGraph& graph, variable_list& outputs) const;
  std::pair<edge_list, variable_list> roots(const RecomputedGraph& graph, variable_list& grads,
                                            variable_list& result) const;
  std::shared_ptr<GroupState> group() const;
  void run_recomputed(const RecomputedGraph& graph, variable_list& grads,
                      const std::vector<size_t>& needed, bool keep_graph, variable_list& result);
  void forward_after_this_backward(std::shared_ptr<const RecomputedGraph> graph, GroupState& group);
  void stop_forwarding();
  void stop_forwarding_locked();
  void redirect(edge_list&& edges);

  std::shared_ptr<RegionState> state_;
  // A copy of the next edges as created: an enclosing region's recompute may redirect them.
  Boundary boundary_;
  // In a GraphExecGroup after its first backward: the recomputed graph the node's next edges
  // lead into (see forward_after_this_backward); null otherwise.
  std::shared_ptr<const RecomputedGraph> forwarded_;
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
