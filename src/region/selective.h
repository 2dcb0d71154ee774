#pragma once

// Selective checkpointing inside a region: during the forward, a caching mode keeps the outputs
// of the operators the policy saves; during the recompute, a replay mode hands them back instead
// of running those operators' kernels. Both are dispatch modes (dispatch_mode.h), so autograd,
// above them, records every operator's node as usual.

#include "autograd/dispatch_mode.h"
#include "autograd/graph.h"
#include "autograd/host_offload.h"
#include "autograd/rng_state.h"
#include "compat/torch_compat.h"

#include <ckpt/selective.h>

#include <ATen/core/DimVector.h>
#include <ATen/core/Tensor.h>
#include <c10/core/TensorImpl.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace ckpt {
namespace detail {

/// Whether `op` is `ckpt::name`, the operator `checkpoint_name` calls (checkpoint_name.cpp).
bool names_tensor(const c10::OperatorHandle& op);

/// The outputs one region kept, in the order its forward produced them.
struct KeptOutputs {
  /// A version counter that could show a change to kept data, and its version when last seen.
  struct Counter {
    c10::VariableVersion counter{c10::VariableVersion::DISABLED};
    uint32_t version = 0;
  };
  /// Where an offloaded tensor is: its slot in `offloaded`, and how it lies in its data.
  struct HostCopy {
    size_t slot = 0;
    StorageView view;
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
    // Offloaded: the tensor is in host memory (`returns` holds an undefined tensor in its place).
    c10::optional<HostCopy> host_copy;
  };
  struct Entry {
    explicit Entry(c10::OperatorName name) : op(std::move(name)) {}
    c10::OperatorName op;
    size_t call = 0;                   // the call's number among the forward's operator calls
    bool named = false;                // kept for a name given after the call (checkpoint_name)
    bool must = false;                 // MustSave (PreferSave falls back to recomputing)
    bool offload = false;              // MustOffload or PreferOffload: kept in host memory
    std::vector<c10::IValue> returns;  // tensors as fresh aliases, without autograd history
    std::vector<Watch> watches;        // one per tensor of `returns`, in traversal order
    // A recompute handed these outputs out and then wrote into them in place: a later recompute
    // (a second backward) runs the operator instead.
    bool stale = false;
    // A recompute that keeps no graph handed these outputs out and let go of them (`returns` is
    // empty), so that they live only as long as the recomputed graph needs them.
    bool consumed = false;
  };
  std::vector<Entry> entries;  // by `call`

  std::shared_ptr<OffloadGroup> offloaded;  // the host copies, or null when nothing is offloaded

  /// (End of the forward, after seal) Moves the outputs of the entries marked `offload` that are
  /// on an accelerator to host memory, and lets go of the device's copy.
  void offload();
  /// Puts the device copies of `entry`'s offloaded outputs back into its `returns`.
  void bring_back(Entry& entry);

  /// Takes the versions of the counters as the region's forward left them (after its absorbed
  /// writes), so that any later change is seen.
  void seal();
};

/// An operator's output as the caching mode remembers it, without holding it: a view of its data
/// may outlive it (matmul returns a view of bmm's product), and it is then made again on that
/// data.
struct RememberedOutput {
  explicit RememberedOutput(const at::Tensor& output);  // a defined tensor
  /// The output itself while it lives, else a tensor made again on its data while that lives
  /// (without autograd history, as kept outputs are), else an undefined tensor.
  at::Tensor get() const;

  c10::weak_intrusive_ptr<c10::TensorImpl> tensor;
  // Null but for a strided tensor.
  c10::weak_intrusive_ptr<c10::StorageImpl> storage{c10::intrusive_ptr<c10::StorageImpl>()};
  at::DimVector sizes, strides;
  int64_t offset = 0;
  at::TensorOptions options;
};

/// Lets go of the saved tensors of a region's forward graph as the forward goes, as PyTorch's
/// pack hooks drop them: when an operator consumes a tensor that a node of the region computed,
/// that node's variables are released. The graph then serves only to find the border. A backward
/// through a released node raises `ReleasedGraphError` with this release's id, which
/// `Region::run_forward` answers by running the function again without releasing.
class GraphRelease {
 public:
  /// `inputs`: the region's tensor arguments. Before the first write into one of them, the
  /// release stops; where it released something already, it raises `ReleasedGraphError`
  /// (`KeepGraphReason::WroteArgument`) before the write, so that the region runs the function
  /// again keeping its graph, which a call that writes into its arguments keeps.
  explicit GraphRelease(const std::vector<at::Tensor>& inputs);
  /// Before `op` runs: releases the region's nodes that computed the tensors among its arguments
  /// on `stack`.
  void release_producers(const c10::OperatorHandle& op, const torch::jit::Stack& stack);
  /// Whether it released a node.
  bool released_any() const { return !released_nodes_.empty(); }
  /// At the forward's end: releases the rest of the region's graph behind `outputs` (its last
  /// operators' nodes), and tells whether something besides that graph and `outputs` still holds
  /// a node it released: an intermediate the function stored elsewhere, whose backward would
  /// reach the released node. Nested regions let go of their arguments as their nodes release.
  bool held_outside(const std::vector<at::Tensor>& outputs);
  /// The id that the `ReleasedGraphError`s of the nodes it released carry (unique per process).
  uint64_t id() const { return id_; }

 private:
  void release(Node& node);

  // Whether `op` writes into one of the arguments' data.
  bool writes_an_argument(const c10::OperatorHandle& op, const torch::jit::Stack& stack) const;

  uint64_t id_;
  std::vector<const c10::StorageImpl*> argument_storages_;
  bool stopped_ = false;  // an argument was written into: the rest of the graph is kept
  std::unordered_set<const Node*> released_;
  std::vector<compat::WeakNodePtr> released_nodes_;  // the same nodes, to see who holds them
  RegionMarker marker_;  // the region's nodes are those created after the release starts
};

/// Keeps the outputs the policy saves (the region's forward), and watches what the operators after
/// them do to their data. An in-place write with nothing reading the data since it was kept (or
/// last written) is absorbed: the entry keeps the written data, and the replay skips the write.
/// That is Linear on 3-d input, which adds its bias in place into the product, through an
/// `aten::_unsafe_view` alias that autograd does not track. Any other write into kept data (after
/// a read, by a random operator, into an `out=` argument) makes the entry keep a copy taken
/// before the write.
///
/// A name (`checkpoint_name`) arrives after the call that computed the named data, so the mode
/// remembers, for the data each call creates, that call and its outputs (without holding them),
/// and keeps them when a name the policy saves points at them: the entry takes the call's place
/// among the kept ones. Errors it raises put the random generators back to `rng` (if given).
class CachingMode : public DispatchMode {
 public:
  CachingMode(SelectivePolicy policy, KeptOutputs& kept, const RngStash* rng = nullptr);
  void dispatch(const c10::OperatorHandle& op, torch::jit::Stack* stack) override;

 private:
  void before_write(const c10::OperatorHandle& op, const torch::jit::Stack& stack,
                    const std::vector<const c10::StorageImpl*>& written);
  void note_reads(const std::vector<const c10::StorageImpl*>& arguments,
                  const torch::jit::Stack& outputs, size_t output_count);
  void name(const c10::OperatorHandle& op, torch::jit::Stack* stack);
  std::string keep_named(const at::Tensor& tensor, bool must, bool offload);
  struct Writes;
  void note_uses(const std::vector<const c10::StorageImpl*>& arguments,
                 const std::vector<const c10::StorageImpl*>& outputs, const Writes& writes);
  void remember_outputs(const c10::OperatorHandle& op, const torch::jit::Stack& stack, size_t call,
                        const std::vector<const c10::StorageImpl*>& arguments);

  // One call whose outputs a name may ask for later.
  struct Call {
    size_t number;
    c10::OperatorHandle op;
    std::vector<RememberedOutput> outputs;  // all it returned: tensors, none undefined
  };
  // What became of data created by a call of the region since then. Writes into it are absorbed
  // as `before_write` absorbs writes into kept data, so that a name given after Linear's bias add
  // keeps its product.
  struct Data {
    std::shared_ptr<const Call> call;
    c10::weak_intrusive_ptr<c10::StorageImpl> storage;  // keeps the address from being reused
    bool read_since_write = false;  // a call read it since it was created or last written
    bool written = false;           // a call wrote into it in a way that cannot be absorbed
    uint32_t absorbed_writes = 0;
    std::vector<KeptOutputs::Counter> counters;  // of the tensors absorbed writes went through
  };
  // The data a call is about to write into; `absorbable` is its in-place argument (see
  // `in_place_self`), if any, and `counter` that argument's version counter.
  struct Writes {
    std::vector<const c10::StorageImpl*> storages;
    const c10::StorageImpl* absorbable = nullptr;
    KeptOutputs::Counter counter;
  };

  SelectivePolicy policy_;
  KeptOutputs& kept_;
  const RngStash* rng_;
  size_t calls_ = 0;  // operator calls so far (names not counted)
  std::unordered_map<const c10::StorageImpl*, Data> data_;
  std::unordered_set<std::string> names_;
};

/// Hands the kept outputs back in the same order (the recompute), and runs everything else. With
/// `consume` (a backward that keeps no graph, after which the region is released anyway), it
/// lets go of each kept output as it hands it out, as PyTorch's selective checkpointing does.
class ReplayMode : public DispatchMode {
 public:
  /// Starts bringing the offloaded outputs back to the device.
  ReplayMode(SelectivePolicy policy, KeptOutputs& kept, bool consume)
      : policy_(std::move(policy)), kept_(kept), consume_(consume) {
    if (kept_.offloaded) kept_.offloaded->prefetch();
  }
  void dispatch(const c10::OperatorHandle& op, torch::jit::Stack* stack) override;
  /// Raises an error when the recompute used fewer kept outputs than the forward kept.
  void check_all_used() const;
  /// Whether `storage` holds kept data this recompute handed out: the forward's own, with the
  /// writes the forward absorbed after the call that computed it.
  bool handed_out(const c10::StorageImpl* storage) const {
    return handed_out_storages_.count(storage) != 0;
  }

 private:
  KeptOutputs::Entry& next_entry(const c10::OperatorHandle& op);
  bool usable(const KeptOutputs::Entry& entry, const std::string& name) const;
  void hand_out(const c10::OperatorHandle& op, KeptOutputs::Entry& entry, torch::jit::Stack* stack);
  bool skip_absorbed_write(const c10::OperatorHandle& op, torch::jit::Stack* stack);
  void mark_written(const std::vector<const c10::StorageImpl*>& written);
  bool named_here(size_t call) const;

  SelectivePolicy policy_;
  KeptOutputs& kept_;
  bool consume_;
  size_t calls_ = 0;  // operator calls so far, counted as the forward counted them
  size_t next_ = 0;
  std::vector<size_t> handed_out_;  // entries whose outputs this recompute handed out
  std::unordered_set<const c10::StorageImpl*> handed_out_storages_;
  // Handed-out data and how many of the writes into it the forward absorbed are still to come.
  std::vector<std::pair<c10::Storage, uint32_t>> writes_to_skip_;
};

}  // namespace detail
}  // namespace ckpt
