#pragma once

// Selective checkpointing inside a region: during the forward, a caching mode keeps the outputs
// of the operators the policy saves; during the recompute, a replay mode hands them back instead
// of running those operators' kernels. Both are dispatch modes (dispatch_mode.h), so autograd,
// above them, records every operator's node as usual.

#include "dispatch_mode.h"

#include <ckpt/selective.h>

#include <ATen/core/Tensor.h>
#include <c10/core/TensorImpl.h>

#include <cstdint>
#include <vector>

namespace ckpt {
namespace detail {

/// The outputs one region kept, in the order its forward produced them.
struct KeptOutputs {
  /// One tensor of an entry's outputs, and what could change it behind the entry's back.
  struct Watch {
    const c10::StorageImpl* storage = nullptr;  // its data (null: undefined or no storage)
    // The kernel's output tensor's version counter and its version when kept (checked: false
    // for a copy the entry owns alone).
    c10::VariableVersion counter{c10::VariableVersion::DISABLED};
    uint32_t version = 0;
    bool checked = false;
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
};

/// Keeps the outputs the policy saves (the region's forward). An operator that writes in place
/// into the data of a kept output (a view of it, or an alias autograd does not track such as
/// `aten::_unsafe_view`'s, which Linear's bias add writes into) makes the entry keep a copy taken
/// before the write.
class CachingMode : public DispatchMode {
 public:
  CachingMode(SelectivePolicy policy, KeptOutputs& kept)
      : policy_(std::move(policy)), kept_(kept) {}
  void dispatch(const c10::OperatorHandle& op, torch::jit::Stack* stack) override;

 private:
  void copy_before_write(const std::vector<const c10::StorageImpl*>& written);

  SelectivePolicy policy_;
  KeptOutputs& kept_;
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
  void mark_written(const std::vector<const c10::StorageImpl*>& written);

  SelectivePolicy policy_;
  KeptOutputs& kept_;
  bool consume_;
  size_t next_ = 0;
  std::vector<size_t> handed_out_;  // entries whose outputs this recompute handed out
};

}  // namespace detail
}  // namespace ckpt
