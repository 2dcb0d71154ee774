#pragma once

// Early stop: a recompute runs the kernels of only those operator calls whose results the
// backward reads. PyTorch stops its recompute once the last saved tensor is recomputed; ckpt's
// recompute rebuilds the region's graph from its outputs, so it cannot stop early, but it can
// skip the kernels whose results nobody reads and still build every autograd node.
//
// Which calls those are is learned per call site from a full recompute: once the recomputed
// outputs are dropped, the data still alive is what the recomputed graph saved (or something
// else holds), and a call is needed when it made such data or data a needed call reads. Later
// recomputes there hand out uninitialised tensors of the recorded geometry for the other calls
// and trace where that data flows. Before the engine runs, any of it still alive means the plan
// was wrong for this recompute: it runs again in full, and the call site stops skipping.

#include <ckpt/detail/region.h>

#include "autograd/dispatch_mode.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/core/Storage.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/intrusive_ptr.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_set>
#include <vector>

namespace ckpt {
namespace detail {

/// Sizes, strides, dtype and device of a tensor.
struct TensorGeometry {
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  c10::Device device = c10::Device(c10::DeviceType::CPU);

  static TensorGeometry of(const at::Tensor& tensor);
  bool operator==(const TensorGeometry& other) const;
};

/// What one call site's full recompute taught: its operator calls in order, and which of them
/// the backward does not need.
struct EarlyStopPlan {
  struct Call {
    c10::OperatorName op{"", ""};
    bool skip = false;
    std::vector<TensorGeometry> arguments;  // of a skipped call: its tensor arguments' geometry
    std::vector<TensorGeometry> returns;    // and that of what it returns
  };
  std::vector<Call> calls;
  size_t skipped = 0;
};

using WeakStorage = c10::weak_intrusive_ptr<c10::StorageImpl>;

/// Watches a full recompute (the outermost mode, so that it sees only kernels that run) and
/// learns its plan. Holding the made data weakly keeps each storage's address its own for the
/// recompute's lifetime, so addresses identify data.
class EarlyStopLearning : public DispatchMode {
 public:
  void dispatch(const c10::OperatorHandle& op, torch::jit::Stack* stack) override;
  /// Call once the recomputed outputs are dropped: the plan, from what is still alive.
  std::shared_ptr<const EarlyStopPlan> plan() const;

 private:
  struct Seen {
    c10::OperatorName op{"", ""};
    bool skippable = false;     // pure, not random, returns fresh dense tensors only
    bool reads_always = false;  // random, writes, or returns other values: its reads matter
    std::vector<const c10::StorageImpl*> reads;
    std::vector<const c10::StorageImpl*> writes;
    std::vector<const c10::StorageImpl*> returns;
    std::vector<TensorGeometry> argument_geometry;
    std::vector<TensorGeometry> return_geometry;
  };
  std::vector<Seen> seen_;
  std::vector<WeakStorage> made_;  // every storage the recompute's calls returned
  std::unordered_set<const c10::StorageImpl*> made_set_;
};

/// Runs a recompute on a plan: skipped calls return uninitialised tensors of their recorded
/// geometry, and every call that reads such data taints what it makes or writes.
class EarlyStopMode : public DispatchMode {
 public:
  explicit EarlyStopMode(std::shared_ptr<const EarlyStopPlan> plan) : plan_(std::move(plan)) {}
  void dispatch(const c10::OperatorHandle& op, torch::jit::Stack* stack) override;
  /// Call once the recomputed outputs are dropped: false when data early stop did not compute
  /// (or computed from such data) is still alive, or went into a value that is not a tensor.
  bool sound() const;
  /// The recompute called other operators than the plan's, or with other shapes: the plan is
  /// stale (those calls ran).
  bool stale() const { return stale_; }
  size_t skipped() const { return skipped_; }

 private:
  bool skips(const c10::OperatorHandle& op, const torch::jit::Stack& stack, size_t call);
  void taint(const c10::OperatorHandle& op, const torch::jit::Stack& stack,
             const std::vector<c10::Storage>& writes);

  std::shared_ptr<const EarlyStopPlan> plan_;
  size_t next_ = 0;
  bool stale_ = false;
  bool unsound_ = false;
  size_t skipped_ = 0;
  std::vector<WeakStorage> tainted_;
  std::unordered_set<const c10::StorageImpl*> tainted_set_;
};

/// Early stop for one recompute at a call site: off, learning the site's plan (a full recompute),
/// or skipping on it.
class EarlyStopRun {
 public:
  /// `enabled`: the region's option, unless the process-wide override says otherwise; off
  /// whatever they say where `forbidden` (a recompute checked by value runs every kernel).
  EarlyStopRun(CallSite& site, bool enabled, bool forbidden = false);
  /// The mode to install, outermost, around the recompute; null when off.
  DispatchMode* mode();
  /// Call once the recomputed outputs are dropped. Stores what a full recompute learned, and
  /// returns false when this one read data it skipped: the caller recomputes again in full
  /// (the call site skips nothing from then on).
  bool finish();

 private:
  CallSite& site_;
  std::optional<EarlyStopLearning> learning_;
  std::optional<EarlyStopMode> skipping_;
};

}  // namespace detail
}  // namespace ckpt
