#include "graph.h"

#include "compat/torch_compat.h"

#include <ATen/SequenceNumber.h>
#include <ATen/ops/empty.h>
#include <ATen/record_function.h>
#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <typeinfo>
#include <unordered_set>

namespace ckpt {
namespace detail {
namespace {

// The root of an engine run that hands the engine its gradients and keeps none of them. Like
// ckpt's border nodes it carries the largest sequence number: it belongs to no region.
class GradientSource final : public Node {
 public:
  // `start`: what the engine passes in, which it requires to be a tensor (an empty one). Its
  // device and that device's current stream are where the engine runs this node and what the
  // nodes that read the gradients synchronize with, as for gradients passed in directly.
  GradientSource(edge_list roots, torch::autograd::variable_list grads, const at::Tensor& start)
      : Node(std::numeric_limits<uint64_t>::max(), std::move(roots)), grads_(std::move(grads)) {
    add_input_metadata(start);
  }
  std::string name() const override { return "ckpt::GradientSource"; }
  torch::autograd::variable_list apply(torch::autograd::variable_list&& /*none*/) override {
    return std::move(grads_);
  }

 private:
  torch::autograd::variable_list grads_;
};

}  // namespace

torch::autograd::variable_list execute_letting_go(const edge_list& roots,
                                                  torch::autograd::variable_list grads,
                                                  EngineRun run, const edge_list& outputs) {
  at::TensorOptions device;  // the CPU's where no gradient is defined
  for (const auto& grad : grads) {
    if (grad.defined()) {
      device = at::TensorOptions().device(grad.device());
      break;
    }
  }
  const at::Tensor start = at::empty({0}, device);
  const compat::NodePtr source =
      compat::make_node<GradientSource>(edge_list(roots), std::move(grads), start);
  return torch::autograd::Engine::get_default_engine().execute(
      {Edge(source, 0)}, {start}, run.keep_graph, run.create_graph, run.accumulate_grad, outputs);
}

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

// The region's nodes a walk has reached. A node's sequence number indexes a slot, which costs no
// allocation per node; a node whose slot is taken by another (nodes may share a number) or lies
// past kMaxSlots goes to a set. The slots grow to the largest number reached, so they cover the
// region's own nodes whenever the walk happens.
class SeenNodes {
 public:
  explicit SeenNodes(const RegionMarker& marker) : first_(marker.first_sequence_nr()) {}

  /// True when `node` (created inside the region) had not been reached before.
  bool insert(Node* node) {
    const uint64_t offset = node->sequence_nr() - first_;
    if (offset < kMaxSlots) {
      if (offset >= slots_.size())
        slots_.resize(std::max(offset + 1, 2 * static_cast<uint64_t>(slots_.size())));
      Node*& slot = slots_[offset];
      if (slot == nullptr) {
        slot = node;
        return true;
      }
      if (slot == node) return false;
    }
    return others_.insert(node).second;
  }

 private:
  static constexpr uint64_t kMaxSlots = uint64_t{1} << 16;
  uint64_t first_;
  std::vector<Node*> slots_;
  std::unordered_set<Node*> others_;
};

// Depth-first walk over the region's nodes; `on_exit(node, index)` is called for each next edge
// that leaves the region, the edges of one node one after another. `shape` counts the nodes.
template <class OnExit>
void walk_region(const edge_list& roots, const RegionMarker& marker, GraphShape& shape,
                 OnExit&& on_exit) {
  SeenNodes seen(marker);
  std::vector<Node*> stack;
  for (const auto& root : roots) {
    Node* node = root.function.get();
    if (node != nullptr && marker.created_inside(*node) && seen.insert(node)) {
      stack.push_back(node);
    }
  }
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    shape.add(*node);
    auto& edges = node->next_edges();
    for (size_t i = 0; i < edges.size(); ++i) {
      Node* next = edges[i].function.get();
      if (next == nullptr) continue;
      if (marker.created_inside(*next)) {
        if (seen.insert(next)) stack.push_back(next);
      } else {
        on_exit(*node, i);
      }
    }
  }
}

}  // namespace

void GraphShape::add(const Node& node) {
  ++nodes;
  // The type's name is one string per type in the process: its address stands for the type.
  uint64_t z = reinterpret_cast<uintptr_t>(typeid(node).name()) + 0x9e3779b97f4a7c15u;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;  // splitmix64's mixer; a sum, so order is free
  kinds += z ^ (z >> 27);
  // Only torch::jit's node types ("N5torch3jit..." mangled) are searched: this runs per node of
  // every region's walk, and autograd's own nodes fail the prefix at its seventh character.
  const char* type = typeid(node).name();
  scripted = scripted || (std::strncmp(type, "N5torch3jit", 11) == 0 &&
                          std::strstr(type, "DifferentiableGraphBackward") != nullptr);
}

size_t BoundaryIndex::EdgeHash::operator()(const std::pair<const Node*, uint32_t>& key) const {
  return std::hash<const Node*>()(key.first) ^ (static_cast<size_t>(key.second) * 0x9e3779b9u);
}

Boundary find_boundary(const edge_list& roots, const RegionMarker& marker) {
  Boundary boundary;
  auto add = [&](const Edge& edge) {
    if (boundary.index.insert(edge, boundary.edges.size())) boundary.edges.push_back(edge);
  };
  for (const auto& root : roots) {
    if (root.function != nullptr && !marker.created_inside(*root.function)) add(root);
  }
  walk_region(roots, marker, boundary.shape, [&](Node& node, size_t i) { add(node.next_edge(i)); });
  return boundary;
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
  Hook(BorderCapture& owner, OutputsToBorder outputs_to_border)
      : owner_(owner), outputs_to_border_(std::move(outputs_to_border)) {}

  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
      const torch::autograd::variable_list& /*inputs*/) override {
    torch::autograd::variable_list passed_on = outputs;
    owner_.hand_over(outputs_to_border_, passed_on);
    return passed_on;
  }

 private:
  BorderCapture& owner_;
  OutputsToBorder outputs_to_border_;
};

BorderCapture::BorderCapture(const edge_list& roots, const RegionMarker& marker,
                             const Boundary& boundary, std::vector<GradientReceiver> receivers)
    : receivers_(std::move(receivers)),
      uses_(boundary.edges.size(), 0),
      uses_by_regions_(boundary.edges.size(), 0),
      terminal_(compat::make_node<BorderTerminal>(boundary.edges)) {
  // (node, its outputs that reach the border); walk_region reports a node's edges together.
  std::vector<std::pair<Node*, OutputsToBorder>> captured;
  // A border edge is usually reached once: enough room for that saves growing both lists.
  captured.reserve(boundary.edges.size());
  original_.reserve(boundary.edges.size());
  try {
    walk_region(roots, marker, shape_, [&](Node& node, size_t i) {
      Edge& edge = node.next_edges()[i];
      const int64_t k = boundary.index.find(edge);
      TORCH_CHECK(k >= 0,
                  "ckpt::checkpoint: the recomputation of the region used a tensor that requires "
                  "grad (a gradient edge into ",
                  edge.function->name(),
                  ") that the forward pass did not use. The checkpointed function must compute the "
                  "same thing when it runs again: do not branch on global state or on values that "
                  "change between the forward and the backward pass. A tensor the function makes "
                  "require grad itself (requires_grad_() on a detached tensor, to take "
                  "torch::autograd::grad with respect to it) is a new tensor in each run: take the "
                  "gradient with respect to an argument of the region instead, or run that part "
                  "outside it.");
      original_.emplace_back(&node, i, edge);
      const auto border = static_cast<size_t>(k);
      ++uses_[border];
      if (is_region_node(node)) {
        ++uses_by_regions_[border];
        region_edges_.push_back({&node, i, border});
      }
      if (!receivers_[border]) {
        edge = Edge();
        any_cut_ = true;
        return;
      }
      // Writing through next_edges() keeps topological numbers as they are: the terminal is a
      // leaf, so every parent's number stays larger than its children's.
      edge = Edge(terminal_, static_cast<uint32_t>(border));
      if (captured.empty() || captured.back().first != &node) {
        captured.emplace_back(&node, OutputsToBorder());
      }
      captured.back().second.emplace_back(i, border);
    });
    hooks_.reserve(captured.size());
    for (auto& [node, outputs_to_border] : captured) {
      if (is_region_node(*node)) {
        auto* region = static_cast<BorderNode*>(node);
        region_captures_.emplace_back(
            region, region->add_output_capture([this, to_border = std::move(outputs_to_border)](
                                                   torch::autograd::variable_list& outputs) {
              hand_over(to_border, outputs);
            }));
        continue;
      }
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

void BorderCapture::hand_over(const OutputsToBorder& outputs_to_border,
                              torch::autograd::variable_list& outputs) {
  const std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [output, k] : outputs_to_border) {
    if (output >= outputs.size() || !outputs[output].defined()) continue;
    receivers_[k](outputs[output]);
    outputs[output].reset();
  }
}

void BorderCapture::restore() noexcept {
  for (auto& [node, key] : hooks_) node->del_post_hook(key);
  hooks_.clear();
  for (auto& [region, key] : region_captures_) region->remove_output_capture(key);
  region_captures_.clear();
  for (auto& [node, i, edge] : original_) {
    // Only an edge still as the capture left it: a region node inside may have redirected its
    // edges meanwhile (in a GraphExecGroup, into its own recomputed graph), which are its own now.
    auto& edges = node->next_edges();
    if (i < edges.size() && (!edges[i].is_valid() || edges[i].function == terminal_)) {
      edges[i] = std::move(edge);
    }
  }
  original_.clear();
}

edge_list BorderCapture::outputs() const {
  if (!any_cut_) return {};
  return {Edge(terminal_, 0)};
}

namespace {

// The gradient accumulator that `edge` ends at, or null. An exact type test, cheaper than a
// dynamic_cast on a path taken for every parameter of every region: nothing derives from it.
torch::autograd::AccumulateGrad* accumulator_of(const Edge& edge) {
  Node* node = edge.function.get();
  if (node == nullptr || typeid(*node) != typeid(torch::autograd::AccumulateGrad)) return nullptr;
  return static_cast<torch::autograd::AccumulateGrad*>(node);
}

}  // namespace

std::function<void(const at::Tensor&)> early_accumulation(const Edge& edge) {
  auto* accumulator = accumulator_of(edge);
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
  return [accumulator](const at::Tensor& gradient) { accumulator->apply({gradient}); };
}

void BorderNode::mark_sole_through_enclosing(size_t k, long enclosing_holders) {
  if (holders_through_enclosing_.size() <= k) holders_through_enclosing_.resize(num_outputs());
  holders_through_enclosing_[k] = enclosing_holders + 2;
}

size_t BorderNode::add_output_capture(OutputCapture capture) {
  captures_.emplace_back(next_capture_, std::move(capture));
  return next_capture_++;
}

void BorderNode::remove_output_capture(size_t key) {
  captures_.erase(std::remove_if(captures_.begin(), captures_.end(),
                                 [key](const auto& entry) { return entry.first == key; }),
                  captures_.end());
}

torch::autograd::variable_list BorderNode::captured(torch::autograd::variable_list outputs) {
  for (auto& [key, capture] : captures_) capture(outputs);
  return outputs;
}

bool is_region_node(const Node& node) {
  return dynamic_cast<const BorderNode*>(&node) != nullptr;
}

std::vector<size_t> accumulate_sole_gradients_early(BorderCapture& border, const Boundary& boundary,
                                                    const std::vector<size_t>& needed,
                                                    const ExpectedHolders& expected) {
  std::vector<long> early(boundary.edges.size(), 0);  // the holders expected where early
  std::vector<size_t> summed_whole;
  for (size_t k : needed) {
    const long holders = expected(k);
    if (holders < 0) continue;
    const Edge& edge = boundary.edges[k];
    // The capture keeps aside one copy of the edge per use, and a nested region's node keeps
    // a copy of its own.
    const long uses = border.uses(k);
    if (edge.function.use_count() !=
        holders + (uses - 1) + static_cast<long>(border.uses_by_regions(k))) {
      continue;
    }
    if (auto receiver = early_accumulation(edge)) {
      if (uses > 1) {
        summed_whole.push_back(k);
        continue;
      }
      border.set_receiver(k, std::move(receiver));
      early[k] = holders;
    }
  }
  // A nested region whose edge leads into such a leaf may add its gradient early too, sparing
  // the enclosing backward from holding it until the nested one returns.
  for (const auto& [node, edge, k] : border.region_edges()) {
    if (early[k] > 0) static_cast<BorderNode*>(node)->mark_sole_through_enclosing(edge, early[k]);
  }
  return summed_whole;
}

bool is_differentiable(const at::Tensor& tensor) {
  return tensor.defined() &&
         (at::isFloatingType(tensor.scalar_type()) || at::isComplexType(tensor.scalar_type()));
}

at::Tensor fresh_alias(const at::Tensor& tensor) {
  return tensor.defined() ? tensor.variable_data() : tensor;
}

at::Tensor output_of(const compat::NodePtr& node, at::Tensor tensor) {
  torch::autograd::impl::set_gradient_edge(tensor, Edge(node, node->add_input_metadata(tensor)));
  return tensor;
}

at::Tensor leaf_variable(const Edge& edge) {
  const auto* accumulator = accumulator_of(edge);
  return accumulator != nullptr ? accumulator->variable : at::Tensor();
}

std::vector<at::Tensor> leaves_reached(const at::Tensor& root) {
  std::vector<at::Tensor> leaves;
  if (!root.defined() || !root.requires_grad()) return leaves;
  std::unordered_set<const Node*> seen;
  std::vector<Edge> pending{torch::autograd::impl::gradient_edge(root)};
  while (!pending.empty()) {
    const Edge edge = std::move(pending.back());
    pending.pop_back();
    if (!edge.is_valid() || !seen.insert(edge.function.get()).second) continue;
    const at::Tensor leaf = leaf_variable(edge);
    if (leaf.defined()) leaves.push_back(leaf);
    for (const Edge& next : edge.function->next_edges()) pending.push_back(next);
  }
  return leaves;
}

void at_first_gradient(const std::vector<at::Tensor>& outputs, std::function<void()> fn) {
  auto once = std::make_shared<std::once_flag>();
  auto call = std::make_shared<std::function<void()>>(std::move(fn));
  for (const at::Tensor& output : outputs) {
    if (!output.defined() || !output.requires_grad()) continue;
    output.register_hook([once, call](const at::Tensor& /*gradient*/) {
      std::call_once(*once, [&] { (*call)(); });
    });
  }
}

bool of_parameter(const at::Tensor& tensor) {
  const at::Tensor base = tensor.is_view() ? at::Tensor(tensor._base()) : tensor;
  return base.is_leaf() && base.requires_grad();
}

}  // namespace detail
}  // namespace ckpt
