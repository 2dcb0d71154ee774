#pragma once

#include <ckpt/detail/region.h>
#include <ckpt/detail/traversal.h>
#include <ckpt/options.h>

#include <ATen/core/grad_mode.h>

#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace ckpt {

#ifndef DOXYGEN_SHOULD_SKIP_THIS
namespace detail {

template <class F, class... Args>
struct BoundCall {
  F fn;
  std::tuple<Args...> args;
};

// Modules are called through forward() (ModuleHolder's operator() cannot tell the return type of
// a templated forward such as Sequential's); anything else through std::invoke.
template <class Fn, class... A>
auto invoke_forward(int /*prefer*/, Fn& fn, A&&... args)
    -> decltype(fn->forward(std::forward<A>(args)...)) {
  return fn->forward(std::forward<A>(args)...);
}
template <class Fn, class... A>
auto invoke_forward(long /*fallback*/, Fn& fn, A&&... args) -> std::invoke_result_t<Fn&, A...> {
  return std::invoke(fn, std::forward<A>(args)...);
}

template <class Fn, class Tuple>
decltype(auto) apply_forward(Fn& fn, Tuple& args) {
  return std::apply(
      [&fn](auto&... unpacked) -> decltype(auto) { return invoke_forward(0, fn, unpacked...); },
      args);
}

// The parameters of a module called as the function (a ModuleHolder or a shared_ptr to one);
// none for other callables.
template <class Fn>
auto module_parameters(int /*prefer*/, const Fn& fn) -> decltype(fn->parameters()) {
  return fn->parameters();
}
template <class Fn>
std::vector<at::Tensor> module_parameters(long /*fallback*/, const Fn& /*fn*/) {
  return {};
}

// `parameters`: what the region checks for in-place changes besides the tensor arguments.
template <class F, class... Args>
auto checkpoint_impl(const CheckpointOptions& options, const std::vector<at::Tensor>& parameters,
                     F&& fn, Args&&... args) {
  using Fn = std::decay_t<F>;
  using Result = std::decay_t<decltype(invoke_forward(0, std::declval<Fn&>(),
                                                      std::declval<std::decay_t<Args>&>()...))>;
  static_assert(!std::is_void_v<Result>,
                "ckpt::checkpoint: the checkpointed function must return its outputs");

  if (!at::GradMode::is_enabled()) {
    // Nothing will be differentiated, so there is nothing to save memory on.
    return Result(invoke_forward(0, fn, std::forward<Args>(args)...));
  }

  using Call = BoundCall<Fn, std::decay_t<Args>...>;
  auto call = std::make_shared<Call>(
      Call{std::forward<F>(fn), std::tuple<std::decay_t<Args>...>(std::forward<Args>(args)...)});
  std::vector<at::Tensor> inputs;
  collect_tensors(call->args, inputs);

  Region region(options, std::move(inputs), parameters);
  Result result = [&]() -> Result {
    at::AutoGradMode mode(region.forward_grad_mode());
    return apply_forward(call->fn, call->args);
  }();

  std::vector<at::Tensor> outputs;
  collect_tensors(result, outputs);
  RecomputeFn recompute = [call](const std::vector<at::Tensor>* replacement) {
    std::vector<at::Tensor> tensors;
    if (replacement == nullptr) {
      collect_tensors(apply_forward(call->fn, call->args), tensors);
    } else {
      auto replaced_args = call->args;
      TensorCursor cursor(*replacement);
      replace_tensors(replaced_args, cursor);
      collect_tensors(apply_forward(call->fn, replaced_args), tensors);
    }
    return tensors;
  };
  const std::vector<at::Tensor> connected = region.finish(std::move(outputs), std::move(recompute));
  TensorCursor cursor(connected);
  replace_tensors(result, cursor);
  return result;
}

}  // namespace detail
#endif  // DOXYGEN_SHOULD_SKIP_THIS

/// Runs `fn(args...)` without keeping its intermediate activations; backward recomputes them.
///
/// Returns exactly what `fn` returns (a tensor, a vector of tensors, a tuple or pair mixing tensors
/// with other values, ...), with every output tensor that requires grad connected to autograd.
/// Arguments may be tensors, `c10::optional<at::Tensor>`, `std::vector<at::Tensor>`, tuples, and
/// any other value, which passes through. `fn` and the arguments are copied and kept until the
/// backward pass: a lambda that captures by reference must outlive it.
///
/// Under `torch::NoGradGuard` it simply runs `fn`. See `CheckpointOptions` for the variants and
/// https://pytorch.org/docs/stable/checkpoint.html for the Python original.
///
/// Example:
/// ```
/// auto y = ckpt::checkpoint([&](const torch::Tensor& t) { return block->forward(t); }, x);
/// ```
template <class F, class... Args,
          std::enable_if_t<!std::is_same_v<std::decay_t<F>, CheckpointOptions>, int> = 0>
auto checkpoint(F&& fn, Args&&... args) {
  return detail::checkpoint_impl(CheckpointOptions{}, detail::module_parameters(0, fn),
                                 std::forward<F>(fn), std::forward<Args>(args)...);
}

/// Runs `fn(args...)` as a checkpointed region with the given options.
///
/// Example:
/// ```
/// auto y = ckpt::checkpoint(ckpt::CheckpointOptions().preserve_rng_state(false), block, x);
/// ```
template <class F, class... Args>
auto checkpoint(const CheckpointOptions& options, F&& fn, Args&&... args) {
  return detail::checkpoint_impl(options, detail::module_parameters(0, fn), std::forward<F>(fn),
                                 std::forward<Args>(args)...);
}

}  // namespace ckpt
