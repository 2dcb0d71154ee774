#pragma once

// A backward's recompute in two passes (`CheckpointOptions::two_pass_recompute`). The first pass
// keeps only what the function's last operators save for the backward; what its first operators
// save (the head: the first saved tensors, as many as give the lowest estimated peak) is let go of
// as it is saved. The first time the backward reads one of those, the function runs once more, from
// the same arguments and random state, and the head's tensors alone are kept. So the backward never
// holds the head's tensors beside the tail's: where a candidate's backward peaks in its last
// operators (attention's softmax, while the projections' inputs wait for their own backward), the
// peak drops by the head's bytes, for one more forward of the candidate.
//
// Tensors are matched between the passes by the order autograd saves them, and checked by
// geometry: a function that saves other tensors the second time is a clear error.

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

namespace ckpt {
namespace detail {

class DispatchMode;
struct RegionState;

/// One backward's recompute of `state`'s region in two passes.
class TwoPassRecompute {
 public:
  /// `let_go_after`: the backward is the region's last; its arguments are let go of once the
  /// second pass has run (the first pass no longer holds what the head saved of them).
  TwoPassRecompute(std::shared_ptr<RegionState> state, bool let_go_after);
  ~TwoPassRecompute();
  TwoPassRecompute(const TwoPassRecompute&) = delete;
  TwoPassRecompute& operator=(const TwoPassRecompute&) = delete;

  /// The first pass: the recomputed outputs, whose graph holds the tail's saved tensors and
  /// reads the head's through the second pass.
  std::vector<at::Tensor> first_pass() const;

  struct Passes;

 private:
  std::shared_ptr<Passes> passes_;
};

/// Installs what saved-tensor hooks need (ckpt's autograd engine) now, outside any backward, for
/// a region whose backward will recompute in two passes. False where hooks are not available in
/// this process (the region then recomputes in one pass).
bool prepare_two_pass_recompute();

}  // namespace detail
}  // namespace ckpt
