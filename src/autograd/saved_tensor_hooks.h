#pragma once

// Saved-tensor hooks in C++. LibTorch asks its autograd engine for the default hooks of every
// tensor autograd saves for the backward; its own engine answers none, and only Python's engine
// has hooks (torch.autograd.graph.saved_tensors_hooks). ckpt installs, once and only when asked,
// an engine of its own that answers with the hooks of the calling thread's innermost scope below.

#include <torch/csrc/autograd/saved_variable_hooks.h>

#include <functional>
#include <memory>

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

/// Whether a scope with a non-empty factory is the innermost one on this thread.
bool saved_tensor_hooks_active();

/// Whether a scope with hooks can open in this process: LibTorch's own engine (or ckpt's) is the
/// default one, not Python's.
bool saved_tensor_hooks_available();

}  // namespace detail
}  // namespace ckpt
