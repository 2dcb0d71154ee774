#pragma once

// The non-template core of `ckpt::checkpoint`: the templates in <ckpt/checkpoint.h> find the
// tensors among arguments and results and hand them to a `Region`, which does the autograd work.

#include <ckpt/options.h>

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <vector>

namespace ckpt {
namespace detail {

/// Runs the checkpointed function again and returns the tensors of its result, in traversal
/// order. `inputs` is null to call it with the original arguments, or holds replacements for the
/// tensor arguments (the reentrant variant passes detached copies).
using RecomputeFn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>* inputs)>;

struct RegionState;
class RegionMarker;

/// One checkpointed call. Construct it just before running the function (it stashes the RNG and
/// autocast state and marks where the region's autograd graph begins), run the function with grad
/// mode set to `forward_grad_mode()`, then pass the result's tensors to `finish`.
class Region {
 public:
  /// `parameters`: tensors the function reads besides its inputs (a module's parameters), checked
  /// for in-place changes before a recompute. The non-reentrant variant also finds the
  /// parameters at its border by itself; the reentrant one records no graph to find them in.
  Region(const CheckpointOptions& options, std::vector<at::Tensor> inputs,
         const std::vector<at::Tensor>& parameters = {});
  ~Region();
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;

  /// Grad mode for the forward call: off for the reentrant variant, on otherwise.
  bool forward_grad_mode() const;

  /// Connects the forward's output tensors to the region's backward node, drops the region's
  /// internal graph, and returns the tensors to hand back to the caller, in the same order.
  std::vector<at::Tensor> finish(std::vector<at::Tensor> outputs, RecomputeFn recompute);

 private:
  std::vector<at::Tensor> finish_non_reentrant(std::vector<at::Tensor> outputs);
  std::vector<at::Tensor> finish_reentrant(std::vector<at::Tensor> outputs);

  std::shared_ptr<RegionState> state_;
  std::unique_ptr<RegionMarker> marker_;
};

}  // namespace detail
}  // namespace ckpt
