#pragma once

// What a `ckpt::GraphExecGroup` keeps: the recomputed graphs of its regions, for the backward
// passes after the first.

#include <ckpt/graph_exec_group.h>

#include "autograd/graph.h"

#include <c10/util/ThreadLocalDebugInfo.h>

#include <functional>
#include <memory>
#include <mutex>
#include <vector>

namespace ckpt {
namespace detail {

/// A region's recomputed graph, held by the gradient edges of its recomputed outputs.
struct RecomputedGraph {
  RegionMarker marker;  // taken before the recompute: its nodes are those created after
  /// Per connected output (by the region node's input number): the gradient edge of the
  /// recomputed output, invalid where the output did not require grad in the recompute.
  edge_list edges;
};

/// A group's regions: for each, what to do when the group ends (the region's node goes back to
/// recomputing, and lets go of its recomputed graph). Carried by the autograd engine to the
/// threads that run a backward started on the group's thread (a device's engine thread).
struct GroupState : c10::DebugInfoBase, std::enable_shared_from_this<GroupState> {
  std::mutex mutex;
  bool ended = false;
  std::vector<std::function<void()>> at_end;

  /// Adds a region's `at_end`; false (and nothing added) when the group has ended.
  bool join(std::function<void()> at_end);
};

/// The group current on the calling thread, or else the one carried to it from the thread that
/// started the backward it runs, or null.
std::shared_ptr<GroupState> current_graph_exec_group();

}  // namespace detail
}  // namespace ckpt
