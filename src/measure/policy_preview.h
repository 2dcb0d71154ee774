#pragma once

// What a selective policy would keep of a plain forward, seen without running a selective region:
// a dispatch mode that notes the storages each operator call makes and, for each policy, those
// whose outputs a selective region could keep (not written in place since). The model profiler
// runs it in the forward that finds the candidates, and skips a policy mode's step where that
// mode could keep no material share less than the plain step anywhere (docs/memory-model.md,
// "Any model").

#include <ckpt/selective.h>

#include "autograd/dispatch_mode.h"

#include <c10/core/StorageImpl.h>
#include <c10/core/TensorImpl.h>

#include <unordered_set>
#include <vector>

namespace ckpt {
namespace detail {

using StorageSet = std::unordered_set<const c10::StorageImpl*>;

class PolicyPreview final : public DispatchMode {
 public:
  explicit PolicyPreview(std::vector<SelectivePolicy> policies) : policies_(std::move(policies)) {}

  void dispatch(const c10::OperatorHandle& op, torch::jit::Stack* stack) override;

  /// What the calls seen since the last `take` made: the storages of their new outputs (not
  /// views, not written into an argument), and per policy those it would keep, less any written
  /// in place since. The notes are cleared.
  struct Made {
    StorageSet storages;
    std::vector<StorageSet> kept;  // by policy
  };
  Made take();

 private:
  struct Output {
    const c10::StorageImpl* storage = nullptr;
    c10::VariableVersion counter;
    uint32_t version = 0;
    std::vector<bool> kept;  // by policy
  };
  std::vector<SelectivePolicy> policies_;
  std::vector<Output> outputs_;
};

}  // namespace detail
}  // namespace ckpt
