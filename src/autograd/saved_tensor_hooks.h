#pragma once

// Saved-tensor hooks in C++. LibTorch asks its autograd engine for the default hooks of every
// tensor autograd saves for the backward; its own engine answers none, and only Python's engine
// has hooks (torch.autograd.graph.saved_tensors_hooks). ckpt installs, once and only when asked,
// an engine of its own that answers with the hooks of the calling thread's innermost scope below.

#include <ATen/core/Tensor.h>
#include <c10/core/TensorImpl.h>
#include <torch/csrc/autograd/saved_variable_hooks.h>

#include <cstdint>

#include <functional>
#include <memory>

namespace torch {
namespace autograd {
struct Node;
}  // namespace autograd
}  // namespace torch

namespace ckpt {
namespace detail {

/// Makes the hooks of one saved tensor (called once per tensor autograd saves).
using SavedHooksFactory = std::function<std::unique_ptr<torch::autograd::SavedVariableHooks>()>;

/// For its lifetime, every tensor that autograd saves on this thread gets the hooks `factory`
/// makes (a null result: none for that tensor). An empty factory turns the outer scopes' hooks
/// off (ckpt's own graphs inside a region, which are dropped, must not pack). Nests. The first
/// scope installs ckpt's engine as LibTorch's default engine, and raises an error when the
/// default engine is not LibTorch's own (Python's, in a process that loaded torch's Python
/// bindings), whose saved-tensor hooks are Python's.
class SavedTensorHooksScope {
 public:
  explicit SavedTensorHooksScope(SavedHooksFactory factory);
  ~SavedTensorHooksScope();
  SavedTensorHooksScope(const SavedTensorHooksScope&) = delete;
  SavedTensorHooksScope& operator=(const SavedTensorHooksScope&) = delete;

 private:
  SavedHooksFactory previous_;
};

/// The leaves (parameters) that live saved variables made under ckpt's hooks refer to, counted
/// by gradient accumulator. Under saved-tensor hooks, LibTorch 2's saved variable of a leaf holds
/// the leaf's accumulator (1.13's a weak reference): one more holder for as long as the variable
/// lives, which a count of the accumulator's holders (`accumulate_sole_gradients_early`) must
/// expect, or it takes an offloaded convolution's weight for a weight used elsewhere too.
class SavedLeafTally {
 public:
  /// Shared with the hooks of the saved variables, which may outlive the tally.
  struct Counts;

  SavedLeafTally();

  /// For its lifetime, the leaves saved under ckpt's hooks on this thread are counted in `tally`
  /// (nests: the innermost counts), where saved variables hold their accumulators; each stays
  /// counted until its saved variable goes.
  class Recording {
   public:
    explicit Recording(const SavedLeafTally& tally);
    ~Recording();
    Recording(const Recording&) = delete;
    Recording& operator=(const Recording&) = delete;

   private:
    std::shared_ptr<Counts> previous_;
  };

  /// How many live saved variables counted here hold `accumulator`.
  long holders_of(const torch::autograd::Node* accumulator) const;

 private:
  std::shared_ptr<Counts> counts_;
};

/// The version of a tensor that saved-tensor hooks packed, checked when the backward unpacks it:
/// autograd's own check, which it leaves to the hooks of a saved variable that has them.
class SavedVersion {
 public:
  /// At pack time.
  void note(const at::Tensor& tensor);
  /// At unpack time: autograd's error where the tensor was written in place since `note`; `by`
  /// names what let go of it (" after ckpt offloaded it").
  void check(const char* by = "") const;

 private:
  c10::VariableVersion counter_;
  uint32_t version_ = 0;
};

/// Whether a scope with a non-empty factory is the innermost one on this thread.
bool saved_tensor_hooks_active();

/// Whether a scope with hooks can open in this process: LibTorch's own engine (or ckpt's) is the
/// default one, not Python's.
bool saved_tensor_hooks_available();

}  // namespace detail
}  // namespace ckpt
