#pragma once

// The non-template core of `ckpt::checkpoint`: the templates in <ckpt/checkpoint.h> find the
// tensors among arguments and results and hand them to a `Region`, which does the autograd work.

#include <ckpt/detail/traversal.h>
#include <ckpt/memory_label.h>
#include <ckpt/options.h>

#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/Storage.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/Exception.h>
#include <c10/util/intrusive_ptr.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace torch {
namespace nn {
class Module;
}  // namespace nn
}  // namespace torch

namespace ckpt {
namespace detail {

struct EarlyStopPlan;

/// Modules a region calls: their buffers are restored after the recompute, and the reentrant
/// variant checks their parameters for in-place changes.
using ModuleList = std::vector<std::shared_ptr<torch::nn::Module>>;

/// What ckpt learns about one place that makes regions, shared between its calls: a place in the
/// code (one per instantiation of the template that makes the region) running its own modules,
/// so that each `Checkpointed`, segment and planned stage learns on its own, and a warning about
/// a place shows once, not once per call.
///
/// What changes how a region builds its graph is learned at a *moment* (`learning_moment`): a
/// region notes the moment its forward began, and its recompute makes the regions inside it as
/// the sites stood then, not as its own forward left them (a nested region that learned to copy
/// its argument ran without the copy in the forward, and must again in the recompute).
struct CallSite {
  std::atomic<bool> warned{false};
  /// The function ran a backward through its own intermediates inside a selectively checkpointed
  /// region: its forward keeps its graph whole here from then on.
  bool keeps_forward_graph_at(uint64_t moment) const;
  /// Whether it had not learned it before.
  bool learn_keeps_forward_graph();
  /// The tensor arguments the function wrote into in place during its forward (bit i: argument
  /// #i, bit 63: #63 and beyond): the region copies them before the function from then on, so
  /// that its recompute starts from their values before the write.
  uint64_t written_inputs_at(uint64_t moment) const;
  /// Whether `written` had a bit not learned before.
  bool learn_written_inputs(uint64_t written);
  /// The buffers of its modules the function wrote into during a forward here (bit i: buffer i in
  /// traversal order): each region copies them before the function, so that its recompute starts
  /// from their values before the write. Every buffer until a forward here wrote one.
  std::atomic<uint64_t> written_buffers{~uint64_t{0}};
  std::atomic<bool> buffers_learned{false};
  /// Early stop: which operator calls of a recompute here the backward does not read, as the
  /// last full recompute here found them (null until one ran, or after a recompute here found the
  /// plan stale).
  std::shared_ptr<const EarlyStopPlan> early_stop_plan;
  std::mutex early_stop_mutex;
  /// A recompute here read data that early stop had not computed (and ran again in full): the
  /// function's behaviour changes between recomputes, so recomputes here run in full from now on.
  std::atomic<bool> early_stop_failed{false};
  /// A backward's recompute in two passes here (`CheckpointOptions::two_pass_recompute`): how many
  /// of the tensors the function saves for the backward the first pass lets go of as they are
  /// saved, as the last recompute here found (`kUnknownHead` until one ran).
  static constexpr size_t kUnknownHead = SIZE_MAX;
  std::atomic<size_t> two_pass_head{kUnknownHead};

 private:
  std::atomic<bool> learned_any_{false};
  mutable std::mutex learned_mutex_;
  std::vector<std::pair<uint64_t, uint64_t>> written_inputs_;  // (moment, every bit learned by it)
  uint64_t keeps_forward_graph_since_ = UINT64_MAX;
};

/// Now, for what call sites learn: a count of their lessons, or inside a recompute, the moment its
/// region's forward began (`LearnedAsAt`).
uint64_t learning_moment();

/// While alive, on this thread, call sites answer as they stood at `moment`.
class LearnedAsAt {
 public:
  explicit LearnedAsAt(uint64_t moment);
  ~LearnedAsAt();
  LearnedAsAt(const LearnedAsAt&) = delete;
  LearnedAsAt& operator=(const LearnedAsAt&) = delete;

 private:
  std::optional<uint64_t> before_;
};

/// The call site of the code identified by `code` (the address of a static of its own) running
/// `modules`: the same object for as long as the first of them lives, or `fallback` (that
/// static) where there are no modules.
std::shared_ptr<CallSite> call_site(CallSite& fallback, const ModuleList& modules);

/// Runs the checkpointed function again and returns the tensors of its result, in traversal
/// order. `inputs` are its tensor arguments (the region holds them; the reentrant variant passes
/// detached copies): the call keeps none of its own.
using RecomputeFn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>* inputs)>;

/// Why a region's forward, which lets go of its graph's saved tensors as it goes, runs its
/// function again keeping the graph.
enum class KeepGraphReason {
  BackwardInside,    // the function ran a backward through its own intermediates
  StoredOutside,     // it stored an intermediate outside the region, not among its results
  WroteArgument,     // it writes into an argument: this call keeps its graph (Region::finish)
  WroteBuffer,       // it wrote into a buffer not copied before: likewise
  DrewBesideReplay,  // another thread replayed a generator it drew from: likewise
};

/// ckpt's signal that a region's forward needs the graph it released: a backward inside its
/// function reached a node whose saved tensors that forward released (raised by a pre-hook on
/// each such node), or the function is about to write into an argument. Caught by
/// `Region::run_forward` (which runs the function again keeping its graph) when it is its own
/// forward's, identified by `forward_id`.
class ReleasedGraphError : public c10::Error {
 public:
  explicit ReleasedGraphError(uint64_t forward_id,
                              KeepGraphReason reason = KeepGraphReason::BackwardInside);
  uint64_t forward_id() const { return forward_id_; }
  KeepGraphReason reason() const { return reason_; }

 private:
  uint64_t forward_id_;
  KeepGraphReason reason_;
};

/// A region's output that its function can compute again (see `RegionRequest`): a region that
/// takes it may keep this instead of the tensor.
class RecomputeSource;

/// What a planner asks of the next region made on the calling thread (set by a
/// `RegionRequestScope`; the region constructed next takes it, so regions inside its function
/// don't see it). Non-reentrant regions without a selective policy only; others ignore it.
struct RegionRequest {
  /// Per tensor argument (traversal order; shorter means null for the rest): where non-null, the
  /// region does not hold the argument from its forward to its backward, but computes it again
  /// from this source when its recompute needs it. The argument must be that source's output.
  std::vector<std::shared_ptr<const RecomputeSource>> input_sources;
  /// Make the region's outputs recomputable: `output_sources` then gets one source per output
  /// tensor (null for those that don't require grad).
  bool recomputable_outputs = false;
  /// Filled by the region when it finishes.
  std::vector<std::shared_ptr<const RecomputeSource>> output_sources;
  /// Of a candidate (`ckpt::candidate`), whatever it runs as: the markers reached inside its
  /// function, in its forward and in every recompute, run as regions with these options, and the
  /// markers inside those likewise, so that a backward holds one part's activations at a time.
  /// None: they run plainly, as part of the candidate.
  std::optional<CheckpointOptions> inner_candidates;
  /// Filled by the candidate's marker when it returns: how many markers its forward reached
  /// directly inside it.
  int inner_markers = 0;
};

/// Makes `request` the one the next region on the calling thread takes, for its lifetime.
class RegionRequestScope {
 public:
  explicit RegionRequestScope(RegionRequest& request);
  ~RegionRequestScope();
  RegionRequestScope(const RegionRequestScope&) = delete;
  RegionRequestScope& operator=(const RegionRequestScope&) = delete;
};

struct RegionState;
class RegionMarker;
class CachingMode;
class GraphRelease;
class RecordingMode;
class ValueRecordingMode;
class DispatchModeGuard;
class BufferGuard;
class OutsideStateWatch;
class ReportMode;
class RegionRecord;
class SavedTensorHooksScope;

/// One checkpointed call. Construct it just before running the function (it stashes the RNG and
/// autocast state and marks where the region's autograd graph begins), run the function inside a
/// `Region::ForwardScope`, then pass the result's tensors to `finish`.
class Region {
 public:
  /// `modules`: the modules the function calls that ckpt can see (the function itself, or module
  /// arguments). The recompute leaves their buffers as the forward left them, so BatchNorm's
  /// running statistics move once per step.
  Region(const CheckpointOptions& options, std::vector<at::Tensor> inputs, ModuleList modules,
         std::shared_ptr<CallSite> site);
  ~Region();
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;

  /// Runs the forward call `fn` inside a `ForwardScope` and returns its result. A non-reentrant
  /// forward lets go of its graph's saved tensors as it goes (as PyTorch's pack hooks drop them).
  /// Where the call needs that graph after all (`KeepGraphReason`: a backward through the
  /// function's own intermediates inside it, an intermediate stored elsewhere than among its
  /// results, a write into an argument after something was let go of, a buffer written that no
  /// copy can put back, random draws beside another thread's replay), the region runs the
  /// function again keeping its graph; for the first two, so does every later call at this call
  /// site (PyTorch recomputes the function in those cases too). In between, the random
  /// generators, the modules' buffers and what the function wrote outside the region go back to
  /// where the first run started.
  template <class Fn>
  auto run_forward(Fn&& fn) -> decltype(fn()) {
    for (;;) {
      {
        ForwardScope scope(*this);
        KeepGraphReason reason = KeepGraphReason::BackwardInside;
        try {
          auto result = fn();
          std::vector<at::Tensor> outputs;
          collect_tensors(result, outputs);
          const std::optional<KeepGraphReason> needed = scope.released_graph_needed(outputs);
          if (!needed) {
            scope.finished();
            return result;
          }
          reason = *needed;
        } catch (const ReleasedGraphError& error) {
          if (!scope.failed_on_released_graph(error)) throw;
          reason = error.reason();
        }
        prepare_second_forward(reason);
      }
    }
  }

 private:
  /// For the forward call: grad mode off for the reentrant variant and on otherwise; the release
  /// of the graph's saved tensors as the forward goes (with a copy of each of the modules' buffers
  /// taken before its first write, for a second run); and with a selective policy, the operator
  /// interception that keeps the outputs it saves.
  class ForwardScope {
   public:
    explicit ForwardScope(Region& region);
    ~ForwardScope();
    ForwardScope(const ForwardScope&) = delete;
    ForwardScope& operator=(const ForwardScope&) = delete;

    /// The function returned: the buffers stay as it left them.
    void finished();
    /// Whether `error` is a backward inside the function reaching a node this forward released.
    bool failed_on_released_graph(const ReleasedGraphError& error) const;
    /// The function returned `outputs`: why the call needs the graph this forward released, if
    /// it does (an intermediate stored elsewhere holds a released node, or the call keeps its
    /// graph: a buffer written that no copy can put back, draws beside another thread's replay).
    std::optional<KeepGraphReason> released_graph_needed(const std::vector<at::Tensor>& outputs);

   private:
    Region& region_;
    RegionContext context_;  // outermost: the user's forward context, from `context_fn`
    LabelScope label_;       // the region's memory label: "region N" under the caller's
    at::AutoGradMode grad_mode_;
    // The region's own graph is dropped: an OffloadGuard around the region must not pack it.
    std::unique_ptr<SavedTensorHooksScope> hooks_off_;
    std::unique_ptr<BufferGuard> buffers_;
    std::unique_ptr<CachingMode> caching_;
    std::unique_ptr<DispatchModeGuard> caching_guard_;
    std::unique_ptr<GraphRelease> release_;  // run by the outside watch, before each operator
    // Under a ReportScope, just inside the caching mode: it sees whether that kept each call.
    std::unique_ptr<ReportMode> report_;
    std::unique_ptr<DispatchModeGuard> report_guard_;
    std::unique_ptr<RecordingMode> recording_;  // innermost: it sees the calls the cache answers
    std::unique_ptr<DispatchModeGuard> recording_guard_;
    std::unique_ptr<ValueRecordingMode> values_;  // with check_values
    std::unique_ptr<DispatchModeGuard> values_guard_;
    // Innermost: what the function writes outside the region's sight and reads again (a module
    // a lambda captures), as it was before, for the recompute.
    std::unique_ptr<OutsideStateWatch> outside_;
    std::unique_ptr<DispatchModeGuard> outside_guard_;
  };

 public:
  /// Connects the forward's output tensors to the region's backward node, drops the region's
  /// internal graph, and returns the tensors to hand back to the caller, in the same order.
  std::vector<at::Tensor> finish(std::vector<at::Tensor> outputs, RecomputeFn recompute);

 private:
  std::vector<at::Tensor> finish_non_reentrant(std::vector<at::Tensor> outputs);
  std::vector<at::Tensor> finish_reentrant(std::vector<at::Tensor> outputs);
  void apply_request();
  void prepare_second_forward(KeepGraphReason reason);
  bool wrote_into_inputs_unexpectedly();
  bool wrote_into_buffers_unexpectedly();
  bool drew_beside_a_replay();

  std::shared_ptr<RegionState> state_;
  std::shared_ptr<CallSite> site_;
  std::unique_ptr<RegionMarker> marker_;
  std::function<RegionContext()> forward_context_;  // from `context_fn`, for the forward
  std::unique_ptr<RegionRecord> report_;            // under a ReportScope: what the region keeps
  RegionRequest* request_ = nullptr;                // a planner's, taken at construction
};

}  // namespace detail
}  // namespace ckpt
