#pragma once

// A dispatch mode in C++: while a DispatchModeGuard is alive on a thread, every operator call of
// that thread that reaches the kernels (below autograd and ADInplaceOrView, above the backends)
// goes to the mode instead, which decides what runs. This is what PyTorch's TorchDispatchMode
// does in Python; LibTorch has no C++ form of it, so ckpt builds one on a boxed fallback kernel
// for DispatchKey::Fake, which LibTorch itself leaves unused (docs/mechanism.md, "Selective
// checkpointing").

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/ops/empty.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <optional>
#include <string>

namespace ckpt {
namespace detail {

/// The storage a tensor's data lives in, or null (undefined, or without storage): how modes tell
/// which tensors share data.
inline const c10::StorageImpl* storage_of(const at::Tensor& tensor) {
  return tensor.defined() && tensor.has_storage() ? tensor.storage().unsafeGetStorageImpl()
                                                  : nullptr;
}

/// All of `storage`'s bytes as a 1-d byte tensor on its device, with a version counter of its own:
/// how ckpt copies a tensor's data whatever its view, and writes it back without a version bump.
inline at::Tensor bytes_of(const c10::Storage& storage) {
  const auto n = static_cast<int64_t>(storage.nbytes());
  return at::empty({0}, at::TensorOptions().dtype(at::kByte).device(storage.device()))
      .set_(storage, 0, {n}, {1});
}

/// An operator's name as errors show it: "aten::addmm", "aten::mul.Tensor".
inline std::string operator_label(const c10::OperatorName& name) {
  return name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
}

/// Whether the operator returns a view of an argument (a return aliased without being written):
/// its output holds no values, and it launches no kernel, of its own.
inline bool returns_a_view(const c10::OperatorHandle& op) {
  for (const c10::Argument& ret : op.schema().returns()) {
    const c10::AliasInfo* alias = ret.alias_info();
    if (alias != nullptr && !alias->isWrite()) return true;
  }
  return false;
}

/// Why a region cannot keep the outputs of `op` from its forward for its recompute, or nullptr
/// when it can: an operator that writes into its arguments, one that returns a view, one that
/// draws random numbers (skipping it in the recompute would shift the stream the rest replays).
inline const char* why_outputs_cannot_be_kept(const c10::OperatorHandle& op) {
  const c10::FunctionSchema& schema = op.schema();
  if (schema.is_mutable()) return "which writes into its arguments (in place or out=)";
  for (const auto& result : schema.returns()) {
    if (result.alias_info() != nullptr) return "which returns a view of its input";
  }
  if (op.hasTag(at::Tag::nondeterministic_seeded)) return "which draws random numbers";
  return nullptr;
}

/// Calls `fn` on each defined tensor in `value`: a tensor, or a list of tensors or of optional
/// tensors (an operator's argument or return, as modes see it on the stack).
template <class Fn>
void for_each_tensor(const c10::IValue& value, Fn fn) {
  if (value.isTensor()) {
    if (value.toTensor().defined()) fn(value.toTensor());
  } else if (value.isList()) {
    for (const c10::IValue& element : value.toListRef()) {
      if (element.isTensor() && element.toTensor().defined()) fn(element.toTensor());
    }
  }
}

class DispatchMode {
 public:
  virtual ~DispatchMode() = default;
  /// One operator call: its arguments are on `stack`; leave its returns there. The mode itself is
  /// off while it runs (the modes below it, if any, still see what it calls).
  virtual void dispatch(const c10::OperatorHandle& op, torch::jit::Stack* stack) = 0;

  /// Runs the operator as if this mode were not there.
  static void run(const c10::OperatorHandle& op, torch::jit::Stack* stack) { op.callBoxed(stack); }
};

/// While alive, no mode of this thread sees its operator calls: for ckpt's own work inside a
/// forward (offloading's copies), which is no operator of the user's function.
class DispatchModesOff {
 public:
  DispatchModesOff();

 private:
  c10::impl::ExcludeDispatchKeyGuard off_;
};

/// Whether an operator call of this thread would reach a mode now: a cheap thread-local check.
bool dispatch_mode_active();

/// Makes `mode` the innermost mode of this thread for its lifetime. Raises an error when the
/// fallback kernel cannot be installed (another library took DispatchKey::Fake).
class DispatchModeGuard {
 public:
  explicit DispatchModeGuard(DispatchMode& mode);
  ~DispatchModeGuard();
  DispatchModeGuard(const DispatchModeGuard&) = delete;
  DispatchModeGuard& operator=(const DispatchModeGuard&) = delete;

 private:
  std::optional<c10::impl::IncludeDispatchKeyGuard> include_;
};

}  // namespace detail
}  // namespace ckpt
