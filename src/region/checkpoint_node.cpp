#include "checkpoint_node.h"

#include "compat/torch_compat.h"
#include "early_stop.h"
#include "two_pass_recompute.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/variable.h>

#include <mutex>
#include <optional>
#include <typeinfo>
#include <utility>

namespace ckpt {
namespace detail {
namespace {

using torch::autograd::Engine;

void add_gradient(at::Tensor& sum, const at::Tensor& grad) {
  if (!grad.defined()) return;
  sum = sum.defined() ? sum + grad : grad;
}

bool any_defined(const variable_list& grads) {
  for (const auto& grad : grads) {
    if (grad.defined()) return true;
  }
  return false;
}

// The reentrant recompute's arguments: detached copies of the tensor arguments, leaves that
// require grad as the arguments did (their `.grad` is the region's input gradient). An argument
// the function writes into comes from its copy before the write, through a clone: autograd
// refuses in-place writes into a leaf that requires grad.
struct DetachedInputs {
  std::vector<at::Tensor> leaves;
  std::vector<at::Tensor> arguments;
};

DetachedInputs detached_inputs(const RegionState& state) {
  DetachedInputs detached;
  for (size_t i = 0; i < state.inputs.size(); ++i) {
    const at::Tensor& input = state.inputs[i];
    at::Tensor leaf;
    if (state.input_copies.copied(i)) {
      leaf = state.input_copies.fresh(i, /*with_history=*/false);
    } else if (input.defined()) {
      leaf = input.detach();
      leaf.set_requires_grad(input.requires_grad());
    }
    const at::AutoGradMode grad_mode(true);
    const bool written = state.input_copies.copied(i) && leaf.requires_grad();
    detached.arguments.push_back(written ? leaf.clone() : leaf);
    detached.leaves.push_back(std::move(leaf));
  }
  return detached;
}

}  // namespace

NonReentrantBackward::NonReentrantBackward(std::shared_ptr<RegionState> state, Boundary boundary)
    : BorderNode(edge_list(boundary.edges)),
      state_(std::move(state)),
      boundary_(std::move(boundary)) {}

void NonReentrantBackward::release_variables() {
  std::lock_guard<std::mutex> lock(mutex_);
  const bool by_enclosing_forward = !state_->in_engine_call;
  state_->end_backward();
  if (by_enclosing_forward) {
    // An enclosing forward let go of its graph: this node never runs, and holds no copy of its
    // edges either (the enclosing region counts who holds the nodes they lead to).
    boundary_ = Boundary();
    forwarded_.reset();
    return;
  }
  if (forwarded_ == nullptr || !state_->released) return;
  // The region is done: its node lets go of the recomputed graph, after the engine has routed
  // this call's gradients along the edges into it.
  if (compat::inside_backward()) {
    Engine::get_default_engine().queue_callback([weak = compat::weak_node(*this)] {
      if (auto node = weak.lock()) static_cast<NonReentrantBackward&>(*node).stop_forwarding();
    });
  } else {
    stop_forwarding_locked();
  }
}

// The gradient edges of the recomputed outputs that feed the node's inputs.
void NonReentrantBackward::take_edges(RecomputedGraph& graph, variable_list& outputs) const {
  for (size_t slot : state_->connected) {
    const at::Tensor& output = outputs[slot];
    graph.edges.push_back(output.requires_grad() ? torch::autograd::impl::gradient_edge(output)
                                                 : Edge());
  }
  // Past their gradient edges the recomputed outputs are not needed; the region's backward
  // should not hold them (PyTorch's recompute keeps only what the graph saved).
  outputs.clear();
}

// The recomputed graph: the gradient edges of the recomputed outputs. With early stop, a
// recompute that read data it skipped runs again in full; the check comes once the outputs are
// dropped, when only the graph (or something unknown) can hold that data. In two passes, the
// graph reads what its first operators saved from a second run of the function.
std::shared_ptr<const RecomputedGraph> NonReentrantBackward::recompute(bool two_passes,
                                                                       bool last) const {
  if (two_passes) {
    auto graph = std::make_shared<RecomputedGraph>();
    variable_list outputs = TwoPassRecompute(state_, /*let_go_after=*/last).first_pass();
    state_->check_recomputed(outputs);
    take_edges(*graph, outputs);
    return graph;
  }
  for (bool early = state_->options.early_stop();; early = false) {
    auto graph = std::make_shared<RecomputedGraph>();
    // Every kernel must run for its values to be checked.
    EarlyStopRun early_stop(*state_->site, early, /*forbidden=*/state_->options.check_values());
    variable_list outputs = state_->run_recompute(/*replacement=*/nullptr, early_stop.mode());
    state_->check_recomputed(outputs);
    take_edges(*graph, outputs);
    if (early_stop.finish()) return graph;
  }
}

// The engine's roots: the recomputed outputs that have a gradient. An output the function did
// not compute (an argument, a captured tensor) is not a root: its gradient goes straight to its
// boundary edge in `result`. The gradients are moved out of `grads` (the engine's inputs to this
// node), so that each lives only until the recompute's node that reads it has run.
std::pair<edge_list, variable_list> NonReentrantBackward::roots(const RecomputedGraph& graph,
                                                                variable_list& grads,
                                                                variable_list& result) const {
  edge_list roots;
  variable_list root_grads;
  for (size_t slot = 0; slot < grads.size(); ++slot) {
    if (!grads[slot].defined()) continue;
    const Edge& edge = graph.edges[slot];
    TORCH_CHECK(edge.is_valid(), "ckpt::checkpoint: output #", state_->connected[slot],
                " of the region required grad in the forward pass but not in the recomputation. "
                "The checkpointed function must compute the same thing when it runs again.");
    if (graph.marker.created_inside(*edge.function)) {
      roots.push_back(edge);
      root_grads.push_back(std::move(grads[slot]));
    } else {
      // The function returned a tensor it did not compute (an argument, a captured tensor).
      const int64_t k = boundary_.index.find(edge);
      TORCH_CHECK(k >= 0, "ckpt::checkpoint: output #", state_->connected[slot],
                  " of the recomputation is a different tensor than in the forward pass. The "
                  "checkpointed function must compute the same thing when it runs again.");
      add_gradient(result[static_cast<size_t>(k)], grads[slot]);
    }
  }
  return {std::move(roots), std::move(root_grads)};
}

// The group this backward belongs to: the forward's, else the one current on this thread.
std::shared_ptr<GroupState> NonReentrantBackward::group() const {
  std::shared_ptr<GroupState> group = state_->forward_group.lock();
  return group != nullptr ? group : current_graph_exec_group();
}

variable_list NonReentrantBackward::apply(variable_list&& grads) {
  // An enclosing capture takes the gradients for its border here, not in an engine post-hook
  // (which would hold `grads` through the whole recompute and backward).
  return captured(backward(std::move(grads)));
}

variable_list NonReentrantBackward::backward(variable_list&& grads) {
  std::lock_guard<std::mutex> lock(mutex_);
  state_->begin_backward(grads);
  if (forwarded_ != nullptr) {
    state_->check_unmodified(/*recomputes=*/false);  // the recomputed graph reads nothing again
    return std::move(grads);  // into the recomputed graph, whose nodes the engine runs itself
  }
  const size_t boundary_count = boundary_.edges.size();
  variable_list result(boundary_count);

  std::vector<size_t> needed;
  for (size_t k = 0; k < boundary_count; ++k) {
    if (task_should_compute_output(k)) needed.push_back(k);
  }
  if (needed.empty() || !any_defined(grads)) return result;

  state_->check_unmodified();
  const std::shared_ptr<GroupState> group = this->group();
  const bool keep = group != nullptr;
  const bool last = state_->backward_is_last(keep);
  // A graph kept for later backward passes, or differentiated again, holds all it saved anyway.
  const bool two_passes = state_->recompute_twice && !keep && !at::GradMode::is_enabled();
  const std::shared_ptr<const RecomputedGraph> graph = recompute(two_passes, last);
  if (last && !two_passes) state_->let_go_of_arguments();
  run_recomputed(*graph, grads, needed, keep, result);
  if (keep) forward_after_this_backward(graph, *group);
  return result;
}

// In a group, once this backward is over, the node hands its gradients to the recomputed graph
// instead of recomputing: its next edges become the recomputed outputs' edges. A later backward
// then runs through that graph as plain autograd would run through the forward's, summing at
// each node what reaches it from every path (a gradient penalty's double-backward graph leads
// into it too), so it costs no recompute and gives plain autograd's bits. Not before the backward
// is over: the engine routes this call's outputs along the node's edges, and its graph task knows
// only those.
void NonReentrantBackward::forward_after_this_backward(std::shared_ptr<const RecomputedGraph> graph,
                                                       GroupState& group) {
  compat::WeakNodePtr weak = compat::weak_node(*this);
  auto stop = [weak] {
    if (auto node = weak.lock()) static_cast<NonReentrantBackward&>(*node).stop_forwarding();
  };
  if (!group.join(std::move(stop))) return;
  Engine::get_default_engine().queue_callback([weak, graph = std::move(graph)] {
    auto node = weak.lock();
    if (node == nullptr) return;
    auto& self = static_cast<NonReentrantBackward&>(*node);
    std::lock_guard<std::mutex> lock(self.mutex_);
    if (self.state_ == nullptr || self.state_->released) return;
    self.redirect(edge_list(graph->edges));
    self.forwarded_ = graph;
  });
}

// Assigned directly: set_next_edges() would recompute the node's topological number, which
// LibTorch refuses once the node has parents. The number only lets `autograd::grad` skip nodes
// that cannot lead to its inputs; the recomputed graph leads to the same border the old number
// was taken from, so it stays a valid bound for every input outside the region.
void NonReentrantBackward::redirect(edge_list&& edges) {
  next_edges_ = std::move(edges);
}

void NonReentrantBackward::stop_forwarding() {
  std::lock_guard<std::mutex> lock(mutex_);
  stop_forwarding_locked();
}

void NonReentrantBackward::stop_forwarding_locked() {
  if (forwarded_ == nullptr) return;
  redirect(edge_list(boundary_.edges));
  forwarded_.reset();
}

// The backward through a fresh recompute. Every needed border edge gets a receiver, which
// collects its gradients: each is returned summed over the region's uses, and reaches its
// accumulator with the rest of the backward's.
void NonReentrantBackward::run_recomputed(const RecomputedGraph& graph, variable_list& grads,
                                          const std::vector<size_t>& needed, bool keep_graph,
                                          variable_list& result) {
  auto [roots, root_grads] = this->roots(graph, grads, result);
  if (roots.empty()) return;
  const bool create_graph = at::GradMode::is_enabled();
  std::vector<GradientReceiver> receivers(boundary_.edges.size());
  for (size_t k : needed) {
    receivers[k] = [&result, k](const at::Tensor& grad) { add_gradient(result[k], grad); };
  }
  BorderCapture border(roots, graph.marker, boundary_, std::move(receivers));
  // The walks start at the same outputs only when every output has a gradient.
  if (roots.size() == state_->connected.size()) {
    state_->check_same_graph(boundary_.shape, border.shape());
  }
  const bool plain_backward = !create_graph && Engine::get_default_engine().is_checkpoint_valid();
  if (plain_backward) {
    accumulate_sole_gradients_early(border, boundary_, needed,
                                    [this](size_t k) { return sole_holders(k); });
  }
  // With create_graph the engine warns once that backward(create_graph=True) ties parameters to
  // their gradients: advice for a user's own backward, which this run is not (a gradient penalty
  // through torch::autograd::grad raised it; issue 46).
  std::optional<compat::WarningFilter> engine_advice;
  if (create_graph) engine_advice.emplace("Using backward() with create_graph=True");
  execute_letting_go(roots, std::move(root_grads),
                     EngineRun{keep_graph || create_graph, create_graph, /*accumulate_grad=*/true},
                     border.outputs());
}

// Holders of a border edge's accumulator when nothing else leads to it: the boundary's copy of
// the edge, this node's next edge, and the region's one edge into it (kept aside by the capture),
// plus each enclosing region's boundary copy and next edge where they redirected this node's
// edge (and vouched that it is the one gradient; issue 46, item 6: two levels were counted as one,
// so regions three deep held every inner gradient until the outer backward ended).
long NonReentrantBackward::sole_holders(size_t k) const {
  constexpr long kSoleHolders = 3;
  const long through_enclosing = holders_through_enclosing(k);
  return through_enclosing > 0 ? through_enclosing : kSoleHolders;
}

ReentrantBackward::ReentrantBackward(std::shared_ptr<RegionState> state, edge_list input_edges)
    : OwningNode(std::move(input_edges)), state_(std::move(state)) {}

void ReentrantBackward::release_variables() {
  std::lock_guard<std::mutex> lock(mutex_);
  state_->end_backward();
}

variable_list ReentrantBackward::apply(variable_list&& grads) {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(Engine::get_default_engine().is_checkpoint_valid(),
              "ckpt::checkpoint: with use_reentrant(true), checkpointing is incompatible with "
              "torch::autograd::grad() and with passing `inputs` to backward(). Call backward() "
              "without `inputs`, or use the default CheckpointOptions().use_reentrant(false), "
              "which supports both.");
  state_->begin_backward(grads);
  state_->check_unmodified();

  const DetachedInputs detached = detached_inputs(*state_);
  const variable_list outputs = state_->run_recompute(&detached.arguments);
  state_->check_recomputed(outputs);

  variable_list with_grad;
  variable_list grad_tensors;
  bool any_requires_grad = false;
  for (size_t slot = 0; slot < grads.size(); ++slot) {
    const at::Tensor& output = outputs[state_->connected[slot]];
    if (!output.requires_grad()) continue;
    any_requires_grad = true;
    if (!grads[slot].defined()) continue;
    with_grad.push_back(output);
    grad_tensors.push_back(grads[slot]);
  }
  TORCH_CHECK(any_requires_grad,
              "ckpt::checkpoint: none of the outputs has requires_grad=True, this checkpoint() is "
              "not necessary (with use_reentrant(true) the outputs are recomputed from detached "
              "inputs, so a function that detaches or runs under NoGradGuard gives no gradient). "
              "Remove the checkpoint, or use use_reentrant(false).");
  if (!with_grad.empty()) {
    torch::autograd::backward(with_grad, grad_tensors, /*retain_graph=*/false,
                              /*create_graph=*/false);
  }

  variable_list result;
  result.reserve(detached.leaves.size());
  for (const auto& input : detached.leaves) {
    result.push_back(input.defined() && input.requires_grad() ? input.grad() : at::Tensor());
  }
  return result;
}

}  // namespace detail
}  // namespace ckpt
