#pragma once

#include <ckpt/checkpoint.h>
#include <ckpt/options.h>

#include <c10/core/Device.h>
#include <c10/util/Optional.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace ckpt {

/// What every `Checkpointed` has, whatever module it wraps: look for it with
/// `module->as<ckpt::CheckpointedBase>()`.
class CheckpointedBase : public torch::nn::Module {
 public:
  /// The options the region runs with.
  CheckpointOptions options;

  /// The wrapped module.
  std::shared_ptr<torch::nn::Module> wrapped() const { return wrapped_; }

  /// Sets the training mode of the wrapper and of the wrapped module (Dropout, BatchNorm).
  void train(bool on = true) override;

  void pretty_print(std::ostream& stream) const override;

 protected:
  /// Registers the wrapped module's own parameters, buffers and children under their own names.
  CheckpointedBase(std::shared_ptr<torch::nn::Module> wrapped, const CheckpointOptions& options);

 private:
  std::shared_ptr<torch::nn::Module> wrapped_;
};

#ifndef DOXYGEN_SHOULD_SKIP_THIS
namespace detail {

// The type of `&M::forward`, or void when M's forward is a template (Sequential's, AnyModule's)
// or overloaded.
template <class M, class = void>
struct ForwardSignature {
  using type = void;
};
template <class M>
struct ForwardSignature<M, std::void_t<decltype(&M::forward)>> {
  using type = decltype(&M::forward);
};

template <class M, class = void>
struct ForwardsOneTensor : std::false_type {};
template <class M>
struct ForwardsOneTensor<
    M, std::void_t<decltype(std::declval<M&>().forward(std::declval<const at::Tensor&>()))>>
    : std::true_type {};
template <>
struct ForwardsOneTensor<torch::nn::AnyModule> : std::true_type {};

// Gives `Checkpointed` a non-template forward with the wrapped module's own signature, which
// `AnyModule` (and so `Sequential`) requires. A templated forward becomes one tensor in, one out.
template <class Derived, class Signature>
class CheckpointedForward {
 public:
  torch::Tensor forward(const torch::Tensor& input) {
    return static_cast<Derived&>(*this).run(input);
  }
};
template <class Derived, class R, class C, class... A>
class CheckpointedForward<Derived, R (C::*)(A...)> {
 public:
  R forward(A... args) { return static_cast<Derived&>(*this).run(std::forward<A>(args)...); }
};
template <class Derived, class R, class C, class... A>
class CheckpointedForward<Derived, R (C::*)(A...) const>
    : public CheckpointedForward<Derived, R (C::*)(A...)> {};

template <class M>
struct WrappedHolder {
  using type = torch::nn::ModuleHolder<M>;
};
template <>
struct WrappedHolder<torch::nn::AnyModule> {
  using type = torch::nn::AnyModule;
};

}  // namespace detail
#endif  // DOXYGEN_SHOULD_SKIP_THIS

/// Wraps a module so that its forward runs as a checkpointed region.
///
/// `Checkpointed` takes any module: its forward has the wrapped module's arguments and result
/// (an LSTM's tuple of tensor and state, say); a module with a templated forward, such as a
/// `Sequential`, takes one tensor and returns one. It registers the wrapped module's parameters,
/// buffers and children under their own names, so `named_parameters()` and a saved state are the
/// same with and without the wrapper. The recompute restores the module's buffers: BatchNorm
/// statistics move once per step. `train()`/`eval()`, `to()` and `clone()` reach the wrapped
/// module. Default arguments of the wrapped forward are not carried over: pass every argument.
///
/// Example:
/// ```
/// ckpt::Checkpointed block(torch::nn::Linear(64, 64));
/// auto y = block(x);
/// ```
template <class M = torch::nn::AnyModule>
class CheckpointedImpl
    : public CheckpointedBase,
      public detail::CheckpointedForward<CheckpointedImpl<M>,
                                         typename detail::ForwardSignature<M>::type> {
 public:
  using Holder = typename detail::WrappedHolder<M>::type;

  explicit CheckpointedImpl(Holder module, const CheckpointOptions& options = {})
      : CheckpointedBase(pointer_of(module), options), module_(std::move(module)) {
    static_assert(!std::is_void_v<typename detail::ForwardSignature<M>::type> ||
                      detail::ForwardsOneTensor<M>::value,
                  "ckpt::Checkpointed: this module's forward is overloaded or a template and "
                  "takes no single tensor; call ckpt::checkpoint(module, args...) instead");
  }

  std::shared_ptr<torch::nn::Module> clone(
      const c10::optional<c10::Device>& device = c10::nullopt) const override {
    if constexpr (std::is_same_v<M, torch::nn::AnyModule>) {
      return std::make_shared<CheckpointedImpl>(module_.clone(device), options);
    } else {
      // Module::clone raises its own error when the wrapped module is not Cloneable.
      auto copy = std::dynamic_pointer_cast<M>(module_.ptr()->clone(device));
      return std::make_shared<CheckpointedImpl>(Holder(std::move(copy)), options);
    }
  }

 private:
  friend class detail::CheckpointedForward<CheckpointedImpl<M>,
                                           typename detail::ForwardSignature<M>::type>;

  // A parent's `Cloneable::clone` builds a fresh wrapper in the parent's reset() and then asks it
  // to become a copy of the original's (LibTorch's default leaves the fresh one as it is).
  void clone_(torch::nn::Module& other, const c10::optional<c10::Device>& device) override {
    auto copy = std::dynamic_pointer_cast<CheckpointedImpl>(other.clone(device));
    TORCH_CHECK(copy != nullptr,
                "ckpt::Checkpointed: cloning a parent module found another type of module "
                "registered under this wrapper's name in the original. Register the same "
                "Checkpointed type in the parent's reset().");
    *this = std::move(*copy);
  }

  static std::shared_ptr<torch::nn::Module> pointer_of(const Holder& module) {
    TORCH_CHECK(!module.is_empty(),
                "ckpt::Checkpointed: the module to wrap is empty. Pass a constructed module.");
    return module.ptr();
  }

  template <class... A>
  decltype(auto) run(A&&... args) {
    if constexpr (std::is_same_v<M, torch::nn::AnyModule>) {
      // The module rides along as an argument, so that the region restores its buffers.
      return checkpoint(
          options,
          [](const at::Tensor& input, torch::nn::AnyModule& module) {
            return module.forward<torch::Tensor>(input);
          },
          std::forward<A>(args)..., module_);
    } else {
      return checkpoint(options, module_, std::forward<A>(args)...);
    }
  }

  Holder module_;
};

/// A `ModuleHolder` for `CheckpointedImpl`. The wrapped module's type is deduced:
/// `ckpt::Checkpointed block(torch::nn::Linear(8, 8))` is a `Checkpointed<torch::nn::LinearImpl>`;
/// `Checkpointed<>` wraps an `AnyModule`.
template <class M = torch::nn::AnyModule>
class Checkpointed : public torch::nn::ModuleHolder<CheckpointedImpl<M>> {
 public:
  using torch::nn::ModuleHolder<CheckpointedImpl<M>>::ModuleHolder;
  using Impl = CheckpointedImpl<M>;
};

#ifndef DOXYGEN_SHOULD_SKIP_THIS
template <class M>
Checkpointed(torch::nn::ModuleHolder<M>) -> Checkpointed<M>;
template <class M>
Checkpointed(torch::nn::ModuleHolder<M>, const CheckpointOptions&) -> Checkpointed<M>;
template <class M>
Checkpointed(std::shared_ptr<M>) -> Checkpointed<M>;
template <class M>
Checkpointed(std::shared_ptr<M>, const CheckpointOptions&) -> Checkpointed<M>;
Checkpointed(torch::nn::AnyModule)->Checkpointed<torch::nn::AnyModule>;
Checkpointed(torch::nn::AnyModule, const CheckpointOptions&)->Checkpointed<torch::nn::AnyModule>;
Checkpointed(std::nullptr_t)->Checkpointed<torch::nn::AnyModule>;
#endif  // DOXYGEN_SHOULD_SKIP_THIS

/// Wraps, in place, every submodule of `root` for which `predicate(name, module)` is true in
/// `Checkpointed`, like Python's `apply_activation_checkpointing(check_fn=...)`.
///
/// The walk visits the whole tree depth first; `name` is the qualified name (`body.0`). A match
/// is not wrapped further inside (a warning names matches found there). A module registered at
/// two places in the tree is visited once, with a warning: an optimizer built from the tree's
/// `parameters()` would update its parameters twice. Parameter and buffer names are unchanged. Only
/// the elements of a `Sequential` can be swapped behind the back of the code that calls them: a
/// matching module elsewhere (a member your forward calls directly, or an element of a
/// `ModuleList`) raises an error that names it; wrap such a member where it is declared, as in
/// `block = register_module("block", ckpt::Checkpointed(Block()))`.
///
/// Example:
/// ```
/// ckpt::apply_checkpointing(*model, [](const std::string& name, const torch::nn::Module&) {
///   return name.rfind("body.", 0) == 0;
/// });
/// ```
void apply_checkpointing(
    torch::nn::Module& root,
    const std::function<bool(const std::string& name, const torch::nn::Module& module)>& predicate,
    const CheckpointOptions& options = {});

/// Marks, in place, every element of a `Sequential` in `root` for which `predicate(name, module)`
/// is true as a candidate of `ckpt::PlannedModel` (`ckpt::candidate`, <ckpt/candidate.h>), without
/// editing the model's source: the element becomes a wrapper whose forward is
/// `ckpt::candidate(element, x)`, named after the element's path. The walk is that of
/// `apply_checkpointing`, with its rules: names and parameters are unchanged, a match is not
/// marked again inside (candidates do not nest), and a match that is not a `Sequential`'s element
/// (a member, or an element of a `ModuleList`, which your forward calls directly) raises an error
/// before anything changes: mark those where your forward calls them
/// (`ckpt::candidates<Block>(list, x)` for a `ModuleList`). Elements take and return one tensor.
///
/// Example:
/// ```
/// ckpt::apply_candidates(*model, [](const std::string& name, const torch::nn::Module&) {
///   return name.rfind("blocks.", 0) == 0 && name.find('.', 7) == std::string::npos;
/// });
/// ```
void apply_candidates(
    torch::nn::Module& root,
    const std::function<bool(const std::string& name, const torch::nn::Module& module)>& predicate);

/// The parameters of `module` and its submodules, each once. LibTorch's `parameters()` lists a
/// module registered at two places (a `PlannedSequential` registered beside the `Sequential` it
/// runs) twice, and an optimizer built from that list updates those parameters twice.
///
/// Example:
/// ```
/// torch::optim::SGD optimizer(ckpt::distinct_parameters(*model), /*lr=*/0.1);
/// ```
std::vector<at::Tensor> distinct_parameters(const torch::nn::Module& module);

}  // namespace ckpt
