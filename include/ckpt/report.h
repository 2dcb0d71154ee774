#pragma once

/// \file
/// What checkpointed regions keep for their backward, and why: a report for people (`text()`)
/// and tools (`json()`), the C++ counterpart of JAX's `print_saved_residuals`. docs/report.md
/// says what each entry and total means.

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/intrusive_ptr.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ckpt {

/// What happens to one tensor a region's backward needs.
enum class KeptDecision {
  Kept,        ///< held from the forward until the backward
  Recomputed,  ///< produced again by the backward's recompute
  Offloaded,   ///< held in host memory from the forward until the backward
};

/// How reports spell a decision: "kept", "recomputed", "offloaded".
const char* to_string(KeptDecision decision);

/// One tensor of a region's report.
struct KeptEntry {
  /// What the tensor is: "argument #0", "copy of argument #0", an operator's output
  /// ("aten::addmm", "aten::native_layer_norm output #1"), "RNG state (cpu)", or for a stage of
  /// a `PlannedSequential` "input" and "graph".
  std::string what;
  /// Why the region keeps or recomputes it, in a few words.
  std::string why;
  KeptDecision decision = KeptDecision::Kept;
  std::vector<int64_t> shape;  ///< empty for a measured "graph" entry
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  c10::Device device = c10::Device(c10::DeviceType::CPU);
  /// Bytes of the tensor's data (elements × element size), or the bytes measured for a "graph".
  int64_t bytes = 0;
  /// What the entry adds to the report's kept totals: the bytes of the memory block (storage) its
  /// data lives in, the first time the report meets that block; 0 for a block an earlier kept
  /// entry counted (`shared_with` names it) and for recomputed entries. For an offloaded entry,
  /// what it adds to the offloaded totals: its block's host copy, the first time the region meets
  /// it.
  int64_t counted_bytes = 0;
  /// "region 2: argument #0" where an earlier kept entry counted this entry's block; else empty.
  std::string shared_with;
};

/// What one region (or one stage of a `PlannedSequential`) keeps.
struct RegionReport {
  /// The region's memory label (see `MemoryLabel`): "region 3", "forward/region 1"; for a stage
  /// of a `PlannedSequential` that runs as no region, "stage 4".
  std::string name;
  /// The stage of a `PlannedSequential` the region ran, "stage 4"; empty otherwise.
  std::string stage;
  /// How it stores: "checkpointed", "checkpointed (reentrant)", "selective", "offloaded"
  /// (`offload(true)`); a `PlannedModel` candidate that runs as no region, "kept"; for a stage,
  /// its storage mode's name or the schedule's "forward_input", "forward_none", "plain".
  std::string mode;
  /// A sentence where the entries alone would mislead (a region that keeps nothing, a region
  /// nested in another's forward); else empty.
  std::string note;
  std::vector<KeptEntry> entries;
  int64_t kept_bytes = 0;        ///< the sum of the kept entries' `counted_bytes`
  int64_t recomputed_bytes = 0;  ///< the sum of the recomputed entries' `bytes`
  int64_t offloaded_bytes = 0;   ///< the sum of the offloaded entries' `counted_bytes` (host)
};

class KeptReport;
#ifndef DOXYGEN_SHOULD_SKIP_THIS
namespace detail {
struct ReportAccess;
}  // namespace detail
#endif

/// What the regions whose forward ran under a `ReportScope` keep for their backward, and why.
///
/// A region's entries are its tensor arguments (the recompute starts from them), copies of those
/// it writes into in place, the outputs of the operators a selective policy saves, and the RNG
/// states it stashed: decision "kept". What a selective policy offloads, and what an
/// `offload(true)` region's autograd saves, is listed "offloaded", by the operator that made it,
/// with the host memory it holds. A `PlannedModel` candidate the plan keeps lists its whole
/// graph, measured ("graph"). The operators its recompute runs again are listed with
/// the outputs they produced in the forward, decision "recomputed": what keeping them would have
/// held (autograd itself may save less, or their inputs instead). Operators whose outputs are
/// views of, or writes into, their arguments allocate nothing and are not listed. Parameters and
/// buffers are the model's and are not listed.
///
/// Each memory block is counted once in the whole report, where it first appears: an argument
/// that is a view of another, or that two regions keep, counts once. An argument counts although
/// the caller may hold it too: the region holds it until its backward. So the kept totals are
/// what `MemoryTracker` measures as held after the forward by tensors allocated inside it, less
/// the outputs handed to the caller (tests/region/report_test.cpp checks this to the byte).
///
/// Example:
/// ```
/// torch::nn::Linear layer(64, 64);
/// ckpt::KeptReport report;
/// {
///   ckpt::ReportScope scope(report);
///   auto y = ckpt::checkpoint(
///       ckpt::CheckpointOptions().policy(ckpt::save_ops({"aten::addmm"})),
///       [&](const torch::Tensor& x) { return torch::tanh(layer(x)).sum(); },
///       torch::randn({32, 64}));
/// }
/// std::cout << report.text();
/// ```
class KeptReport {
 public:
  KeptReport() = default;
  /// A copy of what `other` recorded so far (no scope records into the copy).
  KeptReport(const KeptReport& other) : regions_(other.regions_), counted_(other.counted_) {}
  KeptReport& operator=(const KeptReport& other) {
    regions_ = other.regions_;
    counted_ = other.counted_;
    return *this;
  }

  /// The regions, in the order their forward finished (a region nested in another's forward
  /// comes before it).
  const std::vector<RegionReport>& regions() const { return regions_; }
  /// The bytes all regions keep, each memory block counted once.
  int64_t kept_bytes() const;
  /// The bytes of the outputs the regions' recomputes produce again.
  int64_t recomputed_bytes() const;
  /// The host memory the regions' offloaded data holds.
  int64_t offloaded_bytes() const;
  /// The report for people: one line per region and per entry.
  std::string text() const;
  /// The report for tools: one JSON object, `{"kept_bytes", "recomputed_bytes",
  /// "offloaded_bytes", "regions": [{"name", "stage", "mode", "note", "kept_bytes",
  /// "recomputed_bytes", "offloaded_bytes", "entries": [{"what", "why", "decision", "shape",
  /// "dtype", "device", "bytes", "counted_bytes", "shared_with"}]}]}`.
  std::string json() const;

 private:
  friend struct detail::ReportAccess;
  friend class ReportScope;
  // Each memory block the kept entries counted: held weakly, so that no other block takes its
  // address while the report lives, without keeping its data alive.
  struct Counted {
    c10::weak_intrusive_ptr<c10::StorageImpl> storage;
    size_t region;
    size_t entry;
  };
  std::vector<RegionReport> regions_;
  std::vector<Counted> counted_;
  std::atomic<bool> recording_{false};  // a ReportScope records into it
};

/// While alive, makes the checkpointed regions whose forward starts on this thread record what
/// they keep into `report` (regions made in a backward's recompute too, while it lives). Scopes
/// nest: an inner scope on another report takes the regions until it ends. Recording costs an
/// interception of each operator of the regions' forward; outside any scope, nothing.
///
/// A region whose forward raises an error records nothing. A report records under one scope at
/// a time: a second scope on it, on any thread, is an error. The report must outlive the scope;
/// read it on the scope's thread while the scope lives, or anywhere after.
class ReportScope {
 public:
  explicit ReportScope(KeptReport& report);
  ~ReportScope();
  ReportScope(const ReportScope&) = delete;
  ReportScope& operator=(const ReportScope&) = delete;

 private:
  KeptReport& report_;
  KeptReport* previous_;
};

#ifndef DOXYGEN_SHOULD_SKIP_THIS
namespace detail {

/// The report the calling thread's regions record into, or null.
KeptReport* active_report();

/// Stops recording on this thread for its lifetime (a planner's profiling runs).
class ReportPause {
 public:
  ReportPause();
  ~ReportPause();
  ReportPause(const ReportPause&) = delete;
  ReportPause& operator=(const ReportPause&) = delete;

 private:
  KeptReport* previous_;
};

/// What the region layer and the executor write into a report.
struct ReportAccess {
  static std::vector<RegionReport>& regions(KeptReport& report) { return report.regions_; }
  /// Adds a region; returns its index.
  static size_t add_region(KeptReport& report, RegionReport region);
  /// Adds `tensor` to region `region` as `what`, counting its memory block once in the report
  /// (kept), or its bytes as recomputed.
  static void add_tensor(KeptReport& report, size_t region, std::string what, std::string why,
                         KeptDecision decision, const at::Tensor& tensor);
  /// Adds an entry the recompute produces again (its `bytes` and metadata filled in).
  static void add_recomputed(KeptReport& report, size_t region, KeptEntry entry);
  /// Adds an entry held in host memory (its `bytes` and metadata filled in), adding `host_bytes`
  /// to the offloaded totals.
  static void add_offloaded(KeptReport& report, size_t region, KeptEntry entry, int64_t host_bytes);
  /// Adds `bytes` measured on `device` without a tensor to name (a stage's whole graph), kept.
  static void add_measured(KeptReport& report, size_t region, std::string what, std::string why,
                           int64_t bytes, c10::Device device);
  /// Whether `tensor`'s memory block is counted by a kept entry of the report.
  static bool counts(const KeptReport& report, const at::Tensor& tensor);
  /// The regions from `first` on ran inside the forward of a region that let go of their state
  /// with its graph (`outer`): their entries become recomputed, and their blocks uncounted.
  static void freed_with(KeptReport& report, size_t first, const std::string& outer);
};

}  // namespace detail
#endif  // DOXYGEN_SHOULD_SKIP_THIS

}  // namespace ckpt
