#pragma once

#include <ckpt/detail/region.h>
#include <ckpt/detail/traversal.h>
#include <ckpt/graph_exec_group.h>
#include <ckpt/offload.h>
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

// Modules among the function and its arguments: a module holder (`torch::nn::Linear`,
// `torch::nn::AnyModule`, ...) or a `std::shared_ptr` to a module. Modules a lambda captures are
// out of sight: the region finds their buffer writes by watching operators (Region).
template <class T>
auto add_module(int /*prefer*/, const T& value, ModuleList& out)
    -> decltype(value.is_empty(), std::shared_ptr<torch::nn::Module>(value.ptr()), void()) {
  if (!value.is_empty()) out.push_back(value.ptr());
}
template <
    class T,
    std::enable_if_t<std::is_convertible_v<std::shared_ptr<T>, std::shared_ptr<torch::nn::Module>>,
                     int> = 0>
void add_module(int /*prefer*/, const std::shared_ptr<T>& value, ModuleList& out) {
  if (value) out.push_back(value);
}
template <class T>
void add_module(long /*fallback*/, const T& /*value*/, ModuleList& /*out*/) {}
template <class T, class A>
void add_module(int /*prefer*/, const std::vector<T, A>& values, ModuleList& out) {
  for (const auto& value : values) add_module(0, value, out);
}

template <class F, class... Args>
ModuleList modules_of(const F& fn, const Args&... args) {
  ModuleList modules;
  add_module(0, fn, modules);
  (add_module(0, args, modules), ...);
  return modules;
}

template <class T>
constexpr bool kIsOptions = std::is_same_v<std::decay_t<T>, CheckpointOptions>;
template <class T>
constexpr bool kAlwaysFalse = false;

// The region's recompute: the call again, on the tensor arguments the region hands it.
template <class Call>
RecomputeFn recompute_of(std::shared_ptr<Call> call) {
  return [call = std::move(call)](const std::vector<at::Tensor>* arguments) {
    auto args = call->args;
    TensorCursor cursor(*arguments);
    replace_tensors(args, cursor);
    std::vector<at::Tensor> tensors;
    collect_tensors(apply_forward(call->fn, args), tensors);
    return tensors;
  };
}

template <class F, class... Args>
auto checkpoint_impl(const CheckpointOptions& options, F&& fn, Args&&... args) {
  using Fn = std::decay_t<F>;
  using Result = std::decay_t<decltype(invoke_forward(0, std::declval<Fn&>(),
                                                      std::declval<std::decay_t<Args>&>()...))>;
  static_assert(!std::is_void_v<Result>,
                "ckpt::checkpoint: the checkpointed function must return its outputs");
  static_assert(TensorTraversal<Result>::kHasTensors || IsPlainValue<Result>::value,
                "ckpt::checkpoint: the function's result holds no tensor ckpt can see. For a "
                "struct of your own, define `auto ckpt_tensors(YourType& v) { return "
                "std::tie(v.a, v.b); }` next to it (see docs/user-types.md).");

  if (!at::GradMode::is_enabled()) {
    // Nothing will be differentiated, so there is nothing to save memory on. A copy, as in the
    // region: a const module holder gives only const access to its module.
    Fn callable(std::forward<F>(fn));
    return Result(invoke_forward(0, callable, std::forward<Args>(args)...));
  }

  using Call = BoundCall<Fn, std::decay_t<Args>...>;
  auto call = std::make_shared<Call>(
      Call{std::forward<F>(fn), std::tuple<std::decay_t<Args>...>(std::forward<Args>(args)...)});
  std::vector<at::Tensor> inputs;
  collect_tensors(call->args, inputs);
  if (options.offload()) {
    OffloadedRegion offloaded(options, inputs);
    Result result = apply_forward(call->fn, call->args);
    std::vector<at::Tensor> outputs;
    collect_tensors(result, outputs);
    offloaded.finish(outputs);
    return result;
  }

  static CallSite site_without_modules;
  ModuleList modules = std::apply(
      [&](const auto&... unpacked) { return modules_of(call->fn, unpacked...); }, call->args);
  std::shared_ptr<CallSite> site = call_site(site_without_modules, modules);
  const size_t region_input_count = inputs.size();
  Region region(options, std::move(inputs), std::move(modules), std::move(site));
  Result result = region.run_forward([&] { return apply_forward(call->fn, call->args); });

  std::vector<at::Tensor> outputs;
  collect_tensors(result, outputs);
  const std::vector<at::Tensor> connected = region.finish(std::move(outputs), recompute_of(call));
  // The region holds the tensor arguments (or lets go of them: those a planner let it drop, all of
  // them in its last backward) and hands them to each recompute; the call keeps the rest.
  const std::vector<at::Tensor> none(region_input_count);
  TensorCursor cleared(none);
  replace_tensors(call->args, cleared);
  TensorCursor cursor(connected);
  replace_tensors(result, cursor);
  return result;
}

// Options among the arguments stop the call here, before anything else is instantiated, so that
// the compiler shows one short message instead of a template backtrace.
template <class F, class... Args>
auto checkpoint_checked(const CheckpointOptions& options, F&& fn, Args&&... args) {
  if constexpr ((kIsOptions<Args> || ...)) {
    static_assert(kAlwaysFalse<F>,
                  "ckpt::checkpoint: CheckpointOptions go first: checkpoint(options, fn, args...)");
  } else {
    return checkpoint_impl(options, std::forward<F>(fn), std::forward<Args>(args)...);
  }
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
/// When `fn` is a module (a holder such as `torch::nn::Sequential`, or a `std::shared_ptr` to
/// one), or modules are among the arguments, the recompute leaves their buffers as the forward
/// left them: BatchNorm's running statistics move once per step. State it cannot see (a
/// TorchScript module's statistics, or those of a module a lambda captures) is found in the first
/// forward at each call site, with a warning, and put back after each recompute there. A result of
/// a struct type of your own needs a `ckpt_tensors` function (see docs/user-types.md); without one
/// the call does not compile.
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
  return detail::checkpoint_checked(CheckpointOptions{}, std::forward<F>(fn),
                                    std::forward<Args>(args)...);
}

/// Runs `fn(args...)` as a checkpointed region with the given options.
///
/// Example:
/// ```
/// auto y = ckpt::checkpoint(ckpt::CheckpointOptions().preserve_rng_state(false), block, x);
/// ```
template <class F, class... Args>
auto checkpoint(const CheckpointOptions& options, F&& fn, Args&&... args) {
  return detail::checkpoint_checked(options, std::forward<F>(fn), std::forward<Args>(args)...);
}

}  // namespace ckpt
