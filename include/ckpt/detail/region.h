#pragma once

// The non-template core of `ckpt::checkpoint`: the templates in <ckpt/checkpoint.h> find the
// tensors among arguments and results and hand them to a `Region`, which does the autograd work.

#include <ckpt/options.h>

#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>

#include <atomic>
#include <functional>
#include <memory>
#include <vector>

namespace torch {
namespace nn {
class Module;
}  // namespace nn
}  // namespace torch

namespace ckpt {
namespace detail {

/// Modules a region calls: their buffers are restored after the recompute, and the reentrant
/// variant checks their parameters for in-place changes.
using ModuleList = std::vector<std::shared_ptr<torch::nn::Module>>;

/// What one place in the code that calls `checkpoint` shares between its calls (a static of each
/// instantiation), so that a warning about that place shows once, not once per call.
struct CallSite {
  std::atomic<bool> warned{false};
};

/// Runs the checkpointed function again and returns the tensors of its result, in traversal
/// order. `inputs` is null to call it with the original arguments, or holds replacements for the
/// tensor arguments (the reentrant variant passes detached copies).
using RecomputeFn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>* inputs)>;

struct RegionState;
class RegionMarker;
class CachingMode;
class RecordingMode;
class DispatchModeGuard;

/// One checkpointed call. Construct it just before running the function (it stashes the RNG and
/// autocast state and marks where the region's autograd graph begins), run the function inside a
/// `Region::ForwardScope`, then pass the result's tensors to `finish`.
class Region {
 public:
  /// `modules`: the modules the function calls that ckpt can see (the function itself, or module
  /// arguments). The recompute leaves their buffers as the forward left them, so BatchNorm's
  /// running statistics move once per step.
  Region(const CheckpointOptions& options, std::vector<at::Tensor> inputs, ModuleList modules,
         CallSite& site);
  ~Region();
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;

  /// For the forward call: grad mode off for the reentrant variant and on otherwise, and with a
  /// selective policy, the operator interception that keeps the outputs it saves.
  class ForwardScope {
   public:
    explicit ForwardScope(Region& region);
    ~ForwardScope();
    ForwardScope(const ForwardScope&) = delete;
    ForwardScope& operator=(const ForwardScope&) = delete;

   private:
    at::AutoGradMode grad_mode_;
    std::unique_ptr<CachingMode> caching_;
    std::unique_ptr<DispatchModeGuard> caching_guard_;
    std::unique_ptr<RecordingMode> recording_;  // innermost: it sees the calls the cache answers
    std::unique_ptr<DispatchModeGuard> recording_guard_;
  };

  /// Connects the forward's output tensors to the region's backward node, drops the region's
  /// internal graph, and returns the tensors to hand back to the caller, in the same order.
  std::vector<at::Tensor> finish(std::vector<at::Tensor> outputs, RecomputeFn recompute);

 private:
  std::vector<at::Tensor> finish_non_reentrant(std::vector<at::Tensor> outputs);
  std::vector<at::Tensor> finish_reentrant(std::vector<at::Tensor> outputs);

  std::shared_ptr<RegionState> state_;
  CallSite* site_;
  std::unique_ptr<RegionMarker> marker_;
};

}  // namespace detail
}  // namespace ckpt
