#pragma once

// Selective checkpointing inside a region: during the forward, a caching mode keeps the outputs
// of the operators the policy saves; during the recompute, a replay mode hands them back instead
// of running those operators' kernels. Both are dispatch modes (dispatch_mode.h), so autograd,
// above them, records every operator's node as usual.

#include "autograd/dispatch_mode.h"
#include "autograd/graph.h"

#include <ckpt/selective.h>

#include <ATen/core/Tensor.h>
#include <c10/core/TensorImpl.h>

#include <cstdint>
#include <unordered_set>
#include <utility>
#include <vector>

namespace ckpt {
namespace detail {

/// The outputs one region kept, in the order its forward produced them.
struct KeptOutputs {
  /// A version counter that could show a change to kept data, and its version when last seen.
  struct Counter {
    c10::VariableVersion counter{c10::VariableVersion::DISABLED};
    uint32_t version = 0;
  };
  /// One tensor of an entry's outputs, and what could change it behind the entry's back.
  struct Watch {
    const c10::StorageImpl* storage = nullptr;  // its data (null: undefined or no storage)
    // The kernel's output tensor's counter, and those of the tensors an absorbed write went
    // through (none for a copy the entry owns alone).
    std::vector<Counter> counters;
    // In-place writes of the forward whose result the data holds: the replay skips as many
    // writes into the data it hands out (Linear's bias add into its product).
    uint32_t absorbed_writes = 0;
    // (forward) An operator read the data since it was kept or last written: a write now must
    // leave the data as it was, so the entry takes a copy instead of absorbing it.
    bool read_since_write = false;
  };
  struct Entry {
    c10::OperatorName op;
    bool must = false;                 // MustSave (PreferSave falls back to recomputing)
    std::vector<c10::IValue> returns;  // tensors as fresh aliases, without autograd history
    std::vector<Watch> watches;        // one per tensor of `returns`, in traversal order
    // A recompute handed these outputs out and then wrote into them in place: a later recompute
    // (a second backward) runs the operator instead.
    bool stale = false;
    // A recompute that keeps no graph handed these outputs out and let go of them (`returns` is
    // empty), so that they live only as long as the recomputed graph needs them.
    bool consumed = false;
  };
  std::vector<Entry> entries;

  /// Takes the versions of the counters as the region's forward left them (after its absorbed
  /// writes), so that any later change is seen.
  void seal();
};

/// Keeps the outputs the policy saves (the region's forward), and watches what the operators after
/// them do to their data. An in-place write with nothing reading the data since it was kept (or
/// last written) is absorbed: the entry keeps the written data, and the replay skips the write.
/// That is Linear on 3-d input, which adds its bias in place into the product, through an
/// `aten::_unsafe_view` alias that autograd does not track. Any other write into kept data (after
/// a read, by a random operator, into an `out=` argument) makes the entry keep a copy taken
/// before the write.
///
/// With `release_graph`, it also lets go of the region's forward graph's saved tensors as it
/// goes, as PyTorch's pack hooks drop them: when an operator consumes a tensor that a node of the
/// region computed, that node's variables are released. The graph then serves only to find the
/// border. A backward through the region's own intermediates inside its forward reaches a
/// released node, whose pre-hook raises `ReleasedGraphError` with this mode's id; the region
/// then runs its function again without releasing (`Region::run_forward`).
class CachingMode : public DispatchMode {
 public:
  CachingMode(SelectivePolicy policy, KeptOutputs& kept, bool release_graph);
  void dispatch(const c10::OperatorHandle& op, torch::jit::Stack* stack) override;
  /// The id that the `ReleasedGraphError`s of the nodes it released carry (unique per process).
  uint64_t id() const { return id_; }

 private:
  void before_write(const c10::OperatorHandle& op, const torch::jit::Stack& stack);
  void note_reads(const std::vector<const c10::StorageImpl*>& arguments,
                  const torch::jit::Stack& outputs, size_t output_count);
  void release_producers(const c10::OperatorHandle& op, const torch::jit::Stack& stack);

  SelectivePolicy policy_;
  KeptOutputs& kept_;
  bool release_graph_;
  uint64_t id_;
  std::unordered_set<const Node*> released_;
  RegionMarker marker_;  // the region's nodes are those created after the mode starts
};

/// Hands the kept outputs back in the same order (the recompute), and runs everything else. With
/// `consume` (a backward that keeps no graph, after which the region is released anyway), it
/// lets go of each kept output as it hands it out, as PyTorch's selective checkpointing does.
class ReplayMode : public DispatchMode {
 public:
  ReplayMode(SelectivePolicy policy, KeptOutputs& kept, bool consume)
      : policy_(std::move(policy)), kept_(kept), consume_(consume) {}
  void dispatch(const c10::OperatorHandle& op, torch::jit::Stack* stack) override;
  /// Raises an error when the recompute used fewer kept outputs than the forward kept.
  void check_all_used() const;

 private:
  KeptOutputs::Entry& next_entry(const c10::OperatorHandle& op);
  bool usable(const KeptOutputs::Entry& entry, const std::string& name) const;
  void hand_out(const c10::OperatorHandle& op, KeptOutputs::Entry& entry, torch::jit::Stack* stack);
  bool skip_absorbed_write(const c10::OperatorHandle& op, torch::jit::Stack* stack);
  void mark_written(const std::vector<const c10::StorageImpl*>& written);

  SelectivePolicy policy_;
  KeptOutputs& kept_;
  bool consume_;
  size_t next_ = 0;
  std::vector<size_t> handed_out_;  // entries whose outputs this recompute handed out
  // Handed-out data and how many of the writes into it the forward absorbed are still to come.
  std::vector<std::pair<c10::Storage, uint32_t>> writes_to_skip_;
};

}  // namespace detail
}  // namespace ckpt
