#include "graph.h"

#include "compat/torch_compat.h"

#include <ATen/SequenceNumber.h>
#include <ATen/record_function.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>

#include <limits>
#include <set>
#include <unordered_set>

namespace ckpt {
namespace detail {

RegionMarker::RegionMarker()
    : first_sequence_nr_(at::sequence_number::peek()),
      thread_id_(at::RecordFunction::currentThreadId()) {}

bool RegionMarker::created_inside(const Node& node) const {
  const uint64_t sequence_nr = node.sequence_nr();
  // Gradient accumulators carry the largest sequence number, whoever creates them.
  if (sequence_nr == std::numeric_limits<uint64_t>::max()) return false;
  return sequence_nr >= first_sequence_nr_ && node.thread_id() == thread_id_ &&
         dynamic_cast<const torch::autograd::AccumulateGrad*>(&node) == nullptr;
}

namespace {

// Depth-first walk over the region's nodes; `on_exit(node, index)` is called for each next edge
// that leaves the region.
template <class OnExit>
void walk_region(const edge_list& roots, const RegionMarker& marker, OnExit&& on_exit) {
  std::unordered_set<Node*> seen;
  std::vector<Node*> stack;
  for (const auto& root : roots) {
    Node* node = root.function.get();
    if (node != nullptr && marker.created_inside(*node) && seen.insert(node).second) {
      stack.push_back(node);
    }
  }
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    auto& edges = node->next_edges();
    for (size_t i = 0; i < edges.size(); ++i) {
      Node* next = edges[i].function.get();
      if (next == nullptr) continue;
      if (marker.created_inside(*next)) {
        if (seen.insert(next).second) stack.push_back(next);
      } else {
        on_exit(*node, i);
      }
    }
  }
}

}  // namespace

edge_list find_boundary_edges(const edge_list& roots, const RegionMarker& marker) {
  edge_list boundary;
  std::set<std::pair<const Node*, uint32_t>> found;
  auto add = [&](const Edge& edge) {
    if (found.emplace(edge.function.get(), edge.input_nr).second) boundary.push_back(edge);
  };
  for (const auto& root : roots) {
    if (root.function != nullptr && !marker.created_inside(*root.function)) add(root);
  }
  walk_region(roots, marker, [&](Node& node, size_t i) { add(node.next_edge(i)); });
  return boundary;
}

BoundaryIndex::BoundaryIndex(const edge_list& boundary) {
  for (size_t k = 0; k < boundary.size(); ++k) {
    index_.emplace(std::make_pair(boundary[k].function.get(), boundary[k].input_nr),
                   static_cast<int64_t>(k));
  }
}

int64_t BoundaryIndex::find(const Edge& edge) const {
  auto it = index_.find(std::make_pair(edge.function.get(), edge.input_nr));
  return it == index_.end() ? -1 : it->second;
}

EdgeRedirect::EdgeRedirect(const edge_list& roots, const RegionMarker& marker,
                           const BoundaryIndex& index, const edge_list& targets) {
  try {
    walk_region(roots, marker, [&](Node& node, size_t i) {
      Edge& edge = node.next_edges()[i];
      const int64_t k = index.find(edge);
      TORCH_CHECK(k >= 0,
                  "ckpt::checkpoint: the recomputation of the region used a tensor that requires "
                  "grad (a gradient edge into ",
                  edge.function->name(),
                  ") that the forward pass did not use. The checkpointed function must compute the "
                  "same thing when it runs again: do not branch on global state or on values that "
                  "change between the forward and the backward pass.");
      original_.emplace_back(&node, i, edge);
      // Writing through next_edges() keeps topological numbers as they are: a sink is a leaf,
      // so every parent's number stays larger than its children's.
      edge = targets[static_cast<size_t>(k)];
    });
  } catch (...) {
    for (auto& [node, i, edge] : original_) node->next_edges()[i] = std::move(edge);
    throw;
  }
}

EdgeRedirect::~EdgeRedirect() {
  for (auto& [node, i, edge] : original_) node->next_edges()[i] = std::move(edge);
}

namespace {

struct Sink final : compat::OwningNode {
  Sink(const torch::autograd::InputMetadata& metadata,
       std::function<void(const at::Tensor&)> receive)
      // The largest sequence number, as gradient accumulators have: the engine runs the
      // highest-numbered ready node first, so a sink takes its gradient (and frees it) as soon as
      // it is complete instead of after the rest of the graph.
      : OwningNode(/*sequence_nr=*/std::numeric_limits<uint64_t>::max()),
        receive_(std::move(receive)) {
    // A copy of the boundary input's metadata, so the engine validates gradients against it.
    input_metadata_.push_back(metadata);
  }
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    if (grads[0].defined()) receive_(grads[0]);
    return {};
  }
  std::string name() const override { return "ckpt::BoundarySink"; }

 private:
  void release_owned() override { receive_ = nullptr; }

  std::function<void(const at::Tensor&)> receive_;
};

}  // namespace

compat::NodePtr make_sink(const Edge& stands_for, std::function<void(const at::Tensor&)> receive) {
  return compat::make_node<Sink>(stands_for.function->input_metadata(stands_for.input_nr),
                                 std::move(receive));
}

std::function<void(const at::Tensor&)> early_accumulation(const Edge& edge) {
  auto* accumulator = dynamic_cast<torch::autograd::AccumulateGrad*>(edge.function.get());
  // Hooks that must see the gradient, before or after it is added, need the accumulator to run.
  if (accumulator == nullptr || compat::has_tensor_pre_hooks(*accumulator) ||
      compat::has_post_accumulate_grad_hooks(accumulator->variable)) {
    return {};
  }
  const at::Tensor& grad = accumulator->variable.grad();
  if (!grad.defined() || grad.is_sparse() || grad.requires_grad() ||
      !grad.sizes().equals(accumulator->variable.sizes())) {
    return {};
  }
  // `apply` takes the accumulator's lock; the call operator would also run its post-hooks.
  return [owner = edge.function](const at::Tensor& gradient) {
    static_cast<torch::autograd::AccumulateGrad&>(*owner).apply({gradient});
  };
}

at::Tensor leaf_variable(const Edge& edge) {
  const auto* accumulator =
      dynamic_cast<const torch::autograd::AccumulateGrad*>(edge.function.get());
  return accumulator != nullptr ? accumulator->variable : at::Tensor();
}

}  // namespace detail
}  // namespace ckpt
