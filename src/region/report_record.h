#pragma once

// One region's part of a `ckpt::KeptReport`: made when a region starts under a `ReportScope`, it
// watches the operators of the region's forward (a dispatch mode just inside the selective
// caching mode, so it sees whether that kept each call) and, when the region finishes, writes
// what the region's state holds and what its recompute runs again.

#include <ckpt/report.h>

#include "autograd/dispatch_mode.h"
#include "autograd/host_offload.h"

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ckpt {
namespace detail {

struct KeptOutputs;
struct RegionState;

/// An operator call of the forward whose outputs the region did not keep: what its recompute
/// produces again. Metadata only: holding the tensors would keep them alive.
struct RecordedOp {
  struct Output {
    std::vector<int64_t> shape;
    c10::ScalarType dtype;
    c10::Device device;
    int64_t bytes;
    const c10::StorageImpl* storage;  // identity only, during the forward
  };
  std::string name;
  bool random = false;  // draws random numbers: never kept
  std::vector<Output> outputs;
};

/// Records the calls of a region's forward that allocate (outputs in no argument's data) and
/// that `kept` did not keep.
class ReportMode : public DispatchMode {
 public:
  ReportMode(const KeptOutputs* kept, std::vector<RecordedOp>& ops) : kept_(kept), ops_(ops) {}
  void dispatch(const c10::OperatorHandle& op, torch::jit::Stack* stack) override;

 private:
  const KeptOutputs* kept_;
  std::vector<RecordedOp>& ops_;
};

/// What one region records into the report that was active when it started.
class RegionRecord {
 public:
  /// The region's label (its text, "forward/region 2") and mode name.
  RegionRecord(KeptReport& report, std::string name, std::string mode);

  /// The operators of the forward now starting (a second run starts over).
  std::vector<RecordedOp>& start_forward();
  /// The region finished: `holds` whether its state lives on until the backward.
  void finish(const RegionState& state, bool holds);
  /// The region kept its whole graph (it wrote into an argument unexpectedly).
  void keeps_graph();

 private:
  size_t add(std::string note);
  void add_kept(size_t region, const RegionState& state);
  void add_policy_kept(size_t region, const KeptOutputs& kept);

  KeptReport& report_;
  std::string name_;
  std::string mode_;
  size_t first_nested_;  // the report's regions from here on ran inside this one's forward
  std::vector<RecordedOp> ops_;
};

/// What an offloaded region (`offload(true)`) records into the report active when it starts: the
/// operators of its forward, to name the data its autograd saves, and at its end where each block
/// of that data went (host memory, or the device where something else holds it).
class OffloadedRecord {
 public:
  explicit OffloadedRecord(KeptReport& report);
  /// The forward is over: `group` holds what autograd saved, `inputs` are the region's arguments.
  void finish(const OffloadGroup& group, const std::vector<at::Tensor>& inputs);

 private:
  const RecordedOp::Output* producer(const c10::StorageImpl* data, std::string& name) const;

  KeptReport& report_;
  std::string name_;
  std::vector<RecordedOp> ops_;
  ReportMode mode_;
  std::optional<DispatchModeGuard> recording_;
};

}  // namespace detail
}  // namespace ckpt
