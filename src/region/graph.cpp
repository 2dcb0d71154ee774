#include "graph.h"

#include "compat/torch_compat.h"

#include <ATen/SequenceNumber.h>
#include <ATen/record_function.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>

#include <limits>
#include <unordered_set>

namespace ckpt {
namespace detail {

RegionMarker::RegionMarker()
    : first_sequence_nr_(at::sequence_number::peek()),
      thread_id_(at::RecordFunction::currentThreadId()) {}

bool RegionMarker::created_inside(const Node& node) const {
  // Gradient accumulators (and ckpt's own border nodes) carry the largest sequence number,
  // whoever creates them, so they are never inside.
  const uint64_t sequence_nr = node.sequence_nr();
  return sequence_nr != std::numeric_limits<uint64_t>::max() && sequence_nr >= first_sequence_nr_ &&
         node.thread_id() == thread_id_;
}

namespace {

// Depth-first walk over the region's nodes; `on_exit(node, index)` is called for each next edge
// that leaves the region, the edges of one node one after another.
template <class OnExit>
void walk_region(const edge_list& roots, const RegionMarker& marker, OnExit&& on_exit) {
  std::unordered_set<Node*> seen;
  seen.reserve(64);
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

size_t BoundaryIndex::EdgeHash::operator()(const std::pair<const Node*, uint32_t>& key) const {
  return std::hash<const Node*>()(key.first) ^ (static_cast<size_t>(key.second) * 0x9e3779b9u);
}

edge_list find_boundary_edges(const edge_list& roots, const RegionMarker& marker) {
  edge_list boundary;
  BoundaryIndex index;
  auto add = [&](const Edge& edge) {
    if (index.insert(edge, boundary.size())) boundary.push_back(edge);
  };
  for (const auto& root : roots) {
    if (root.function != nullptr && !marker.created_inside(*root.function)) add(root);
  }
  walk_region(roots, marker, [&](Node& node, size_t i) { add(node.next_edge(i)); });
  return boundary;
}

BoundaryIndex::BoundaryIndex(const edge_list& boundary) {
  index_.reserve(boundary.size());
  for (size_t k = 0; k < boundary.size(); ++k) insert(boundary[k], k);
}

bool BoundaryIndex::insert(const Edge& edge, size_t k) {
  return index_.emplace(std::make_pair(edge.function.get(), edge.input_nr), static_cast<int64_t>(k))
      .second;
}

int64_t BoundaryIndex::find(const Edge& edge) const {
  auto it = index_.find(std::make_pair(edge.function.get(), edge.input_nr));
  return it == index_.end() ? -1 : it->second;
}

namespace {

// Where the region's edges into the border end during the engine's run. It has the input
// metadata of every boundary edge, so the engine validates gradients against it.
struct BorderTerminal final : compat::OwningNode {
  explicit BorderTerminal(const edge_list& boundary)
      // The largest sequence number, as gradient accumulators have.
      : OwningNode(/*sequence_nr=*/std::numeric_limits<uint64_t>::max()) {
    input_metadata_.reserve(boundary.size());
    for (const auto& edge : boundary) {
      input_metadata_.push_back(edge.function->input_metadata(edge.input_nr));
    }
  }
  torch::autograd::variable_list apply(torch::autograd::variable_list&&) override { return {}; }
  std::string name() const override { return "ckpt::BorderTerminal"; }

 private:
  void release_owned() override {}
};

}  // namespace

// A post-hook on a node inside the region: takes the gradients it computed for the border.
class BorderCapture::Hook final : public torch::autograd::FunctionPostHook {
 public:
  Hook(BorderCapture& owner, std::vector<std::pair<size_t, size_t>> outputs_to_border)
      : owner_(owner), outputs_to_border_(std::move(outputs_to_border)) {}

  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
      const torch::autograd::variable_list& /*inputs*/) override {
    torch::autograd::variable_list passed_on = outputs;
    const std::lock_guard<std::mutex> lock(owner_.mutex_);
    for (const auto& [output, k] : outputs_to_border_) {
      if (!passed_on[output].defined()) continue;
      owner_.receivers_[k](passed_on[output]);
      passed_on[output].reset();
    }
    return passed_on;
  }

 private:
  BorderCapture& owner_;
  std::vector<std::pair<size_t, size_t>> outputs_to_border_;  // (output, boundary edge)
};

BorderCapture::BorderCapture(const edge_list& roots, const RegionMarker& marker,
                             const edge_list& boundary, const BoundaryIndex& index,
                             std::vector<GradientReceiver> receivers)
    : receivers_(std::move(receivers)), terminal_(compat::make_node<BorderTerminal>(boundary)) {
  // (node, its outputs that reach the border); walk_region reports a node's edges together.
  std::vector<std::pair<Node*, std::vector<std::pair<size_t, size_t>>>> captured;
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
      const auto border = static_cast<size_t>(k);
      if (!receivers_[border]) {
        edge = Edge();
        return;
      }
      // Writing through next_edges() keeps topological numbers as they are: the terminal is a
      // leaf, so every parent's number stays larger than its children's.
      edge = Edge(terminal_, static_cast<uint32_t>(border));
      if (captured.empty() || captured.back().first != &node) {
        captured.emplace_back(&node, std::vector<std::pair<size_t, size_t>>());
      }
      captured.back().second.emplace_back(i, border);
    });
    hooks_.reserve(captured.size());
    for (auto& [node, outputs_to_border] : captured) {
      hooks_.emplace_back(
          node, node->add_post_hook(std::make_unique<Hook>(*this, std::move(outputs_to_border))));
    }
  } catch (...) {
    restore();
    throw;
  }
}

BorderCapture::~BorderCapture() {
  restore();
}

void BorderCapture::restore() noexcept {
  for (auto& [node, key] : hooks_) node->del_post_hook(key);
  hooks_.clear();
  for (auto& [node, i, edge] : original_) node->next_edges()[i] = std::move(edge);
  original_.clear();
}

edge_list BorderCapture::outputs() const {
  return {Edge(terminal_, 0)};
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
