#pragma once

// Walking and temporarily rewiring the autograd graph that a region records.

#include "compat/torch_compat.h"

#include <torch/csrc/autograd/edge.h>
#include <torch/csrc/autograd/function.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

namespace ckpt {
namespace detail {

using torch::autograd::Edge;
using torch::autograd::edge_list;
using torch::autograd::Node;

/// Tells the nodes a region creates from those that existed before it. Sequence numbers are
/// per thread, so a node belongs to the region when the region's thread created it after the
/// marker was taken. Gradient accumulators of leaves never belong to a region.
class RegionMarker {
 public:
  /// Marks the current point of the calling thread.
  RegionMarker();
  bool created_inside(const Node& node) const;

 private:
  uint64_t first_sequence_nr_;
  uint64_t thread_id_;
};

/// The edges that leave the region's graph, reached from `roots` (each edge once, in the order
/// first found). A root that is itself outside the region is a boundary edge too.
edge_list find_boundary_edges(const edge_list& roots, const RegionMarker& marker);

/// Index of each boundary edge, by (node, input number).
class BoundaryIndex {
 public:
  explicit BoundaryIndex(const edge_list& boundary);
  /// The position of `edge` in the boundary, or -1.
  int64_t find(const Edge& edge) const;

 private:
  std::map<std::pair<const Node*, uint32_t>, int64_t> index_;
};

/// For its lifetime, the edges by which the region graph reached from `roots` leaves the region
/// point at `targets[k]` instead of boundary edge k (an invalid target cuts the edge), so that an
/// engine run from `roots` stops at the region's border. The original edges are put back on
/// destruction, because a double-backward graph may still run through these nodes later.
class EdgeRedirect {
 public:
  EdgeRedirect(const edge_list& roots, const RegionMarker& marker, const BoundaryIndex& index,
               const edge_list& targets);
  ~EdgeRedirect();
  EdgeRedirect(const EdgeRedirect&) = delete;
  EdgeRedirect& operator=(const EdgeRedirect&) = delete;

 private:
  std::vector<std::tuple<Node*, size_t, Edge>> original_;
};

/// A node that stands for boundary edge `stands_for` (it has its input metadata) and hands every
/// gradient the engine delivers to it to `receive`. It has no next edges.
compat::NodePtr make_sink(const Edge& stands_for, std::function<void(const at::Tensor&)> receive);

/// A receiver that adds gradients for `edge` into its parameter's `.grad` ahead of the outer
/// backward, where that is allowed: the edge ends at a gradient accumulator, the parameter's
/// `.grad` exists as a dense buffer of the same shape, and no tensor hooks or post-accumulate-grad
/// hooks wait for one summed gradient. Empty otherwise. It adds through the accumulator, under the
/// accumulator's lock (other threads' backward passes add into the same `.grad`), and skips the
/// accumulator's post-hooks, which run once, in the outer backward.
std::function<void(const at::Tensor&)> early_accumulation(const Edge& edge);

/// The leaf tensor (a parameter, say) whose gradient accumulator `edge` ends at, or an undefined
/// tensor when the edge ends elsewhere.
at::Tensor leaf_variable(const Edge& edge);

}  // namespace detail
}  // namespace ckpt
