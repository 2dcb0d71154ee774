#pragma once

// Walking and temporarily rewiring the autograd graph that a region records.

#include "compat/torch_compat.h"

#include <c10/util/SmallVector.h>
#include <torch/csrc/autograd/edge.h>
#include <torch/csrc/autograd/function.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

namespace ckpt {
namespace detail {

using torch::autograd::Edge;
using torch::autograd::edge_list;
using torch::autograd::Node;

/// How `execute_letting_go` runs the engine: `Engine::execute`'s flags.
struct EngineRun {
  bool keep_graph = false;
  bool create_graph = false;
  bool accumulate_grad = true;
};

/// `Engine::execute` from `roots` with their gradients `grads`, letting go of each gradient as
/// autograd's own backward does: once the node that reads it has run. Given to the engine as its
/// inputs, the gradients would be held by that list until the whole run ends, one output-sized
/// tensor above autograd's peak in the backward of every stage of a chain and every region; a
/// node of its own hands them to the engine instead, from the gradients' device and current
/// stream, as the engine would have taken them. Returns the gradients of `outputs`.
torch::autograd::variable_list execute_letting_go(const edge_list& roots,
                                                  torch::autograd::variable_list grads,
                                                  EngineRun run, const edge_list& outputs);

/// Tells the nodes a region creates from those that existed before it. Sequence numbers are
/// per thread, so a node belongs to the region when the region's thread created it after the
/// marker was taken. Gradient accumulators of leaves never belong to a region.
class RegionMarker {
 public:
  /// Marks the current point of the calling thread.
  RegionMarker();
  bool created_inside(const Node& node) const;
  /// The sequence number of the first node the calling thread creates after the marker.
  uint64_t first_sequence_nr() const { return first_sequence_nr_; }

 private:
  uint64_t first_sequence_nr_;
  uint64_t thread_id_;
};

/// Index of each boundary edge, by (node, input number).
class BoundaryIndex {
 public:
  BoundaryIndex() = default;
  /// Records `edge` at position k; false (and nothing changes) when it is already there.
  bool insert(const Edge& edge, size_t k);
  /// The position of `edge` in the boundary, or -1.
  int64_t find(const Edge& edge) const;

 private:
  struct EdgeHash {
    size_t operator()(const std::pair<const Node*, uint32_t>& key) const;
  };
  std::unordered_map<std::pair<const Node*, uint32_t>, int64_t, EdgeHash> index_;
};

/// The nodes a walk of a region's graph reached: how many, and a sum over their types, so that
/// a recompute that builds another graph than the forward did can be told (a module switched to
/// eval() in between, say: Dropout then builds no node).
struct GraphShape {
  size_t nodes = 0;
  uint64_t kinds = 0;
  /// Whether a TorchScript graph executor built part of it (a differentiable graph's node): the
  /// profiling executor specialises its graph after a few runs, so two runs of one function may
  /// build graphs of different shapes that compute the same gradients.
  bool scripted = false;

  void add(const Node& node);
  bool operator==(const GraphShape& other) const {
    return nodes == other.nodes && kinds == other.kinds;
  }
};

/// The edges that leave a region's graph, each once, in the order first found, and their index.
struct Boundary {
  edge_list edges;
  BoundaryIndex index;
  GraphShape shape;  // of the graph inside
};

/// The boundary of the region's graph reached from `roots`. A root that is itself outside the
/// region is a boundary edge too.
Boundary find_boundary(const edge_list& roots, const RegionMarker& marker);

/// Takes the gradient that reaches one boundary edge (called once per use of the edge's tensor).
using GradientReceiver = std::function<void(const at::Tensor&)>;

class BorderNode;

/// For its lifetime, an engine run from `roots` stops at the region's border. The region's edges
/// into boundary edge k end at one shared terminal node, and each gradient that flows along them
/// is handed to `receivers[k]` as soon as the node that computed it returns (a post-hook takes it
/// and leaves an undefined gradient; on a nested region's node, the node's own output capture:
/// see `BorderNode`); an empty receiver cuts those edges, so that gradient is not computed at all.
/// One terminal for the whole border, rather than a node per edge, because the engine's cost of
/// running a node is that of a small operator. Receivers are called under one lock. The original
/// edges are put back and the hooks removed on destruction, because a double-backward graph may
/// still run through these nodes later.
class BorderCapture {
 public:
  BorderCapture(const edge_list& roots, const RegionMarker& marker, const Boundary& boundary,
                std::vector<GradientReceiver> receivers);
  ~BorderCapture();
  BorderCapture(const BorderCapture&) = delete;
  BorderCapture& operator=(const BorderCapture&) = delete;

  /// The engine run's outputs. Every edge out of the region ends at the terminal or is cut, so
  /// the engine cannot leave the region either way; naming the terminal (run with
  /// accumulate_grad=true, the engine runs it once instead of capturing at it) only prunes nodes
  /// that lead to cut edges alone. Where no edge is cut that pruning would cost a walk of the
  /// graph and a lookup per node for nothing, and would make the run look like
  /// `autograd::grad` to a reentrant checkpoint inside, so there are no outputs then.
  edge_list outputs() const;

  /// How many of the region's edges lead into boundary edge k (its tensor's uses in the region).
  uint32_t uses(size_t k) const { return uses_[k]; }
  /// How many of those come from a nested region's node, which holds a copy of the edge too.
  uint32_t uses_by_regions(size_t k) const { return uses_by_regions_[k]; }
  /// A nested region's node's next edge `edge` that leads into boundary edge `border`.
  struct RegionEdge {
    Node* node;
    size_t edge;
    size_t border;
  };
  const std::vector<RegionEdge>& region_edges() const { return region_edges_; }
  /// Replaces the receiver of boundary edge k; only before the engine runs.
  void set_receiver(size_t k, GradientReceiver receiver) { receivers_[k] = std::move(receiver); }
  /// The shape of the graph inside the border, as walked.
  const GraphShape& shape() const { return shape_; }

 private:
  class Hook;
  // (output of a node, boundary edge) pairs; most nodes have one or two edges out of the region.
  using OutputsToBorder = c10::SmallVector<std::pair<size_t, size_t>, 2>;
  void hand_over(const OutputsToBorder& outputs_to_border, torch::autograd::variable_list& outputs);
  void restore() noexcept;

  std::vector<GradientReceiver> receivers_;
  std::vector<uint32_t> uses_;
  std::vector<uint32_t> uses_by_regions_;
  std::vector<RegionEdge> region_edges_;
  GraphShape shape_;
  std::mutex mutex_;
  compat::NodePtr terminal_;
  std::vector<std::tuple<Node*, size_t, Edge>> original_;
  std::vector<std::pair<Node*, uintptr_t>> hooks_;
  std::vector<std::pair<BorderNode*, size_t>> region_captures_;
  bool any_cut_ = false;
};

/// A node that stands for a region inside another graph (the non-reentrant region's node): it
/// keeps a copy of its next edges, the edges by which the region's graph left the region.
class BorderNode : public compat::OwningNode {
 public:
  using compat::OwningNode::OwningNode;
  /// An enclosing backward, which redirected next edge k to itself, adds the gradient of that
  /// edge's leaf into `.grad` as soon as it arrives (it is the leaf's one gradient), expecting
  /// `enclosing_holders` references to its accumulator: this node may add it early itself, with
  /// two more (the enclosing region's boundary copy and next edge). Set before the enclosing
  /// engine run, read during it. Each level of nesting adds its two.
  void mark_sole_through_enclosing(size_t k, long enclosing_holders);

  /// An enclosing `BorderCapture`'s hand-over of the outputs that lead into its border, run by
  /// the node as its backward returns instead of as an engine post-hook: LibTorch keeps a node's
  /// inputs alive while it runs where it has post-hooks, and this node's run is the region's whole
  /// recompute and backward, through which the incoming gradient (an output's size) was held.
  using OutputCapture = std::function<void(torch::autograd::variable_list& outputs)>;
  /// Adds `capture`; the key removes it.
  size_t add_output_capture(OutputCapture capture);
  void remove_output_capture(size_t key);

 protected:
  /// The holders expected of edge k's accumulator where an enclosing backward vouched that its
  /// gradient is the leaf's one, or 0.
  long holders_through_enclosing(size_t k) const {
    return k < holders_through_enclosing_.size() ? holders_through_enclosing_[k] : 0;
  }
  /// `outputs` after the captures: what `apply` returns.
  torch::autograd::variable_list captured(torch::autograd::variable_list outputs);

 private:
  std::vector<long> holders_through_enclosing_;
  std::vector<std::pair<size_t, OutputCapture>> captures_;
  size_t next_capture_ = 0;
};

/// Whether `node` stands for a region (a `BorderNode`), which keeps a copy of its border's edges.
bool is_region_node(const Node& node);

/// How many references to boundary edge k's gradient accumulator the caller of
/// `accumulate_sole_gradients_early` expects when nothing else leads to it (its own copies of the
/// edge, the edge the capture keeps aside), or -1 where the leaf may get another gradient in this
/// backward that no live reference shows.
using ExpectedHolders = std::function<long(size_t k)>;

/// ckpt's one accumulation rule, autograd's own: in one backward a leaf's gradients are summed
/// first and the sum is added into its `.grad` (several added in one by one round differently).
/// A gradient may therefore go into an existing `.grad` as soon as it arrives, so that nobody
/// holds it, only where it is the leaf's sole gradient in this backward: the captured graph
/// uses boundary edge k once, and the accumulator has no reference beyond `expected(k)` and the
/// copies nested regions keep. For each such k in `needed` (and where `early_accumulation`
/// allows it), the capture's receiver becomes the early one, and nested regions whose edge leads
/// there are told they may add early themselves. Regions and the chains' stage graphs both use it.
/// Returns the k in `needed` that the graph uses several times and that pass the same tests (one
/// more holder per use): once the engine run ends, the sum of their gradients is the leaf's
/// whole gradient in this backward, and may go into `.grad` then (`early_accumulation`).
std::vector<size_t> accumulate_sole_gradients_early(BorderCapture& border, const Boundary& boundary,
                                                    const std::vector<size_t>& needed,
                                                    const ExpectedHolders& expected);

/// A receiver that adds gradients for `edge` into its parameter's `.grad` ahead of the outer
/// backward, where that is allowed: the edge ends at a gradient accumulator, the parameter's
/// `.grad` exists as a dense buffer of the same shape, and no tensor hooks or post-accumulate-grad
/// hooks wait for one summed gradient. Empty otherwise. Only `accumulate_sole_gradients_early`
/// calls it: it makes sure the gradient is the accumulator's only input in the backward. It adds
/// through the accumulator, under the accumulator's lock (other threads' backward passes add into
/// the same `.grad`), and skips the accumulator's post-hooks, which run once, in the outer
/// backward. It holds the accumulator by pointer: call it only while the edge (which owns the
/// accumulator) lives.
std::function<void(const at::Tensor&)> early_accumulation(const Edge& edge);

/// Whether gradients can flow through tensors like `tensor`: floating point or complex.
bool is_differentiable(const at::Tensor& tensor);

/// A tensor sharing `tensor`'s data but none of its autograd history (undefined stays undefined).
/// Unlike detach(), it is not a view of `tensor`, so it keeps no graph alive.
at::Tensor fresh_alias(const at::Tensor& tensor);

/// `tensor` (a graph-free alias: `fresh_alias` or a detach) made the output of `node`, its only
/// input: its gradient flows into `node`.
at::Tensor output_of(const compat::NodePtr& node, at::Tensor tensor);

/// The leaf tensor (a parameter, say) whose gradient accumulator `edge` ends at, or an undefined
/// tensor when the edge ends elsewhere.
at::Tensor leaf_variable(const Edge& edge);

/// Every leaf tensor whose gradient a backward from `root` would accumulate, once each.
std::vector<at::Tensor> leaves_reached(const at::Tensor& root);

/// Whether `tensor` is a leaf that requires grad (a parameter), or a view of one (Linear saves its
/// weight transposed): data that lives on whatever the backward holds of it.
bool of_parameter(const at::Tensor& tensor);

/// Calls `fn` once, when the first of `outputs` that requires grad gets its gradient: where the
/// backward of the code that returned them begins. Nothing where none requires grad.
void at_first_gradient(const std::vector<at::Tensor>& outputs, std::function<void()> fn);

}  // namespace detail
}  // namespace ckpt
