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
  struct Entry {
    c10::OperatorName op;
    bool must = false;                 // MustSave (PreferSave falls back to recomputing)
    std::vector<c10::IValue> returns;  // tensors as fresh aliases, without autograd history
    // The version counters of the kernel's output tensors, and their versions when kept: an
    // in-place change later in the forward would make the kept value a different one.
    std::vector<c10::VariableVersion> counters;
    std::vector<uint32_t> versions;
  };
  std::vector<Entry> entries;
};

/// Keeps the outputs the policy saves (the region's forward).
class CachingMode : public DispatchMode {
 public:
  CachingMode(SelectivePolicy policy, KeptOutputs& kept)
      : policy_(std::move(policy)), kept_(kept) {}
  void dispatch(const c10::OperatorHandle& op, torch::jit::Stack* stack) override;

 private:
  SelectivePolicy policy_;
  KeptOutputs& kept_;
};

/// Hands the kept outputs back in the same order (the recompute), and runs everything else.
class ReplayMode : public DispatchMode {
 public:
  ReplayMode(SelectivePolicy policy, const KeptOutputs& kept)
      : policy_(std::move(policy)), kept_(kept) {}
  void dispatch(const c10::OperatorHandle& op, torch::jit::Stack* stack) override;
  /// Raises an error when the recompute used fewer kept outputs than the forward kept.
  void check_all_used() const;

 private:
  SelectivePolicy policy_;
  const KeptOutputs& kept_;
  size_t next_ = 0;
};

}  // namespace detail
}  // namespace ckpt
