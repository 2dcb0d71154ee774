#pragma once

#include <memory>

namespace ckpt {

namespace detail {
struct GroupState;
}  // namespace detail

/// Backward passes that share one recompute per region (PyTorch's `GraphExecGroup`): a gradient
/// penalty (`torch::autograd::grad` with `create_graph`, then `backward`), several losses through
/// one graph, a `retain_graph` loop.
///
/// A non-reentrant region belongs to the group that was current on the thread of its forward, or
/// else to the group current on the thread that calls its backward (also where a device's engine
/// thread runs the region's node; LibTorch 1.13 does not carry a group there, so with 1.13 make the
/// group before the forward on a device). Its first backward in the
/// group recomputes it and keeps the recomputed graph; the later ones run through that graph
/// instead of recomputing. The group frees those graphs when it ends, so they cost memory until
/// then: a region's activations stay alive from its first backward in the group to the group's
/// end. A backward still running when the group ends finishes on what it holds; later backward
/// passes recompute again. Reentrant regions recompute in every backward, as in PyTorch.
///
/// Example:
/// ```
/// ckpt::GraphExecGroup group;  // one recompute for both passes below
/// auto gradient = torch::autograd::grad({y.sum()}, {x}, {}, true, /*create_graph=*/true)[0];
/// (y.sum() + gradient.pow(2).sum()).backward();
/// ```
class GraphExecGroup {
 public:
  /// Makes this group current on the calling thread. Groups do not nest: an error when one is
  /// current already.
  GraphExecGroup();
  /// Ends the group (see `end`), and makes no group current on the calling thread.
  ~GraphExecGroup();
  GraphExecGroup(const GraphExecGroup&) = delete;
  GraphExecGroup& operator=(const GraphExecGroup&) = delete;

  /// Frees the recomputed graphs the group keeps. Backward passes after it recompute again.
  void end();

 private:
  std::shared_ptr<detail::GroupState> state_;
};

}  // namespace ckpt
