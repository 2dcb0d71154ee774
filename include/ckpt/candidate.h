#pragma once

/// \file
/// `ckpt::candidate`: marks a block of any model, in the model's own `forward`, as a region whose
/// storage a planner chooses (`ckpt::PlannedModel`, <ckpt/planned_model.h>). Without a planner
/// at work the block simply runs.

#include <ckpt/checkpoint.h>
#include <ckpt/detail/traversal.h>
#include <ckpt/options.h>

#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace ckpt {
namespace detail {

/// What runs the candidates of a model: a planner's profiler or its executor. It is told of each
/// candidate as it starts and ends, on the thread that runs the model's forward.
class CandidateRunner {
 public:
  virtual ~CandidateRunner() = default;
  /// A candidate starts with `inputs`: named `name` where `module` is null, after `module`'s path
  /// where `name` is empty, "<module's path>.<name>" where both are given. The runner
  /// may replace the inputs (with tensors that tell it when the backward reaches them). Returns
  /// the options of the region to run it as, or none to run it plainly; for a region, `request`
  /// may ask it to drop inputs or to make its outputs recomputable.
  virtual std::optional<CheckpointOptions> begin(const std::string& name,
                                                 const torch::nn::Module* module,
                                                 std::vector<at::Tensor>& inputs,
                                                 RegionRequest& request) = 0;
  /// The candidate returned `outputs`, which the runner may replace likewise; `request` is the
  /// one `begin` filled, with the region's answer.
  virtual void end(std::vector<at::Tensor>& outputs, const RegionRequest& request) = 0;
  /// The candidate raised an exception; `end` won't come.
  virtual void abandon() noexcept = 0;
};

/// The recomputable outputs of one step's regions (`RegionRequest::output_sources`), found again
/// by the tensors later regions take: what a planner's runner asks those regions to drop.
class RecomputableOutputs {
 public:
  /// Records the sources `request` got for `outputs`, returned by candidate `producer`.
  void add(int producer, const std::vector<at::Tensor>& outputs, const RegionRequest& request);
  /// For each of `inputs`, the source of the recomputable output it is (null where none); the
  /// candidate each comes from goes to `producers` (-1 where none).
  std::vector<std::shared_ptr<const RecomputeSource>> sources_for(
      const std::vector<at::Tensor>& inputs, std::vector<int>& producers) const;

 private:
  struct Entry {
    c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> tensor;
    std::shared_ptr<const RecomputeSource> source;
    int producer = -1;
  };
  std::unordered_map<const c10::TensorImpl*, Entry> entries_;
};

/// What the markers inside a running candidate report to: it counts them, and runs each as a
/// region with `options` (none: plainly), asking the same of the markers inside that one.
class InnerCandidates final : public CandidateRunner {
 public:
  InnerCandidates(std::optional<CheckpointOptions> options,
                  std::shared_ptr<std::atomic<int>> reached)
      : options_(std::move(options)), reached_(std::move(reached)) {}
  std::optional<CheckpointOptions> begin(const std::string& name, const torch::nn::Module* module,
                                         std::vector<at::Tensor>& inputs,
                                         RegionRequest& request) override;
  void end(std::vector<at::Tensor>& /*outputs*/, const RegionRequest& /*request*/) override {}
  void abandon() noexcept override {}

 private:
  std::optional<CheckpointOptions> options_;
  std::shared_ptr<std::atomic<int>> reached_;
};

/// The runner of the calling thread, or nullptr.
CandidateRunner* candidate_runner();

/// Makes `runner` (nullptr: none) the calling thread's runner for its lifetime.
class CandidateRunnerScope {
 public:
  explicit CandidateRunnerScope(CandidateRunner* runner);
  ~CandidateRunnerScope();
  CandidateRunnerScope(const CandidateRunnerScope&) = delete;
  CandidateRunnerScope& operator=(const CandidateRunnerScope&) = delete;

 private:
  CandidateRunner* previous_;
};

// A module holder (`torch::nn::Linear`, a TORCH_MODULE of your own) or a std::shared_ptr to a
// module: what the module form of `candidate` takes (an AnyModule has a form of its own).
template <class T, class = void>
struct IsModuleHandle : std::false_type {};
template <>
struct IsModuleHandle<torch::nn::AnyModule> : std::false_type {};
template <class T>
struct IsModuleHandle<
    T, std::enable_if_t<std::is_convertible_v<T, std::shared_ptr<torch::nn::Module>>>>
    : std::true_type {};
template <class T>
struct IsModuleHandle<
    T, std::enable_if_t<!std::is_same_v<T, torch::nn::AnyModule> &&
                        !std::is_convertible_v<T, std::shared_ptr<torch::nn::Module>> &&
                        std::is_convertible_v<decltype(std::declval<const T&>().ptr()),
                                              std::shared_ptr<torch::nn::Module>>>>
    : std::true_type {};

template <class T>
std::shared_ptr<torch::nn::Module> module_pointer(const T& value) {
  if constexpr (std::is_convertible_v<T, std::shared_ptr<torch::nn::Module>>) {
    return value;
  } else {
    return value.ptr();
  }
}

// The runner a marker reports to, or nullptr where the marker is the plain call: no planner at
// work on this thread, or grad mode off.
inline CandidateRunner* active_candidate_runner() {
  return at::GradMode::is_enabled() ? candidate_runner() : nullptr;
}

// Whether `invoke_forward(0, fn, args...)` is well-formed: the module has a forward taking them.
template <class Fn, class Tuple, class = void>
struct HasForward : std::false_type {};
template <class Fn, class... Args>
struct HasForward<Fn, std::tuple<Args...>,
                  std::void_t<decltype(invoke_forward(0, std::declval<std::decay_t<Fn>&>(),
                                                      std::declval<std::decay_t<Args>&>()...))>>
    : std::true_type {};

// What a marker returns: what `fn(args...)` returns, as `checkpoint` returns it.
template <class Fn, class... Args>
using CandidateResult = std::decay_t<decltype(invoke_forward(
    0, std::declval<std::decay_t<Fn>&>(), std::declval<std::decay_t<Args>&>()...))>;

// Runs `fn` on `args` as a candidate in the region `runner` chooses. `owner`, when given, is the
// module whose buffers a recompute must leave as the forward left them (the region sees it as an
// argument).
template <class F, class Tuple>
auto run_as_candidate(CandidateRunner* runner, const std::string& name,
                      const std::shared_ptr<torch::nn::Module>& owner, F& fn, Tuple& args) {
  std::vector<at::Tensor> tensors;
  collect_tensors(args, tensors);
  std::optional<CheckpointOptions> region;
  RegionRequest request;
  try {
    region = runner->begin(name, owner.get(), tensors, request);
  } catch (...) {
    runner->abandon();
    throw;
  }
  TensorCursor in(tensors);
  replace_tensors(args, in);
  using Result = std::decay_t<decltype(apply_forward(fn, args))>;
  std::optional<Result> result;
  // Markers inside run as the runner asked (plainly, as part of this one, unless it asked for
  // regions), in the forward and in every recompute, and are counted.
  auto reached = std::make_shared<std::atomic<int>>(0);
  try {
    if (region) {
      auto with_owner = [fn, inner = request.inner_candidates, reached](
                            const std::shared_ptr<torch::nn::Module>& /*owner*/,
                            auto&... unpacked) mutable {
        InnerCandidates markers(inner, reached);
        const CandidateRunnerScope scope(&markers);
        return invoke_forward(0, fn, unpacked...);
      };
      const RegionRequestScope requested(request);
      result.emplace(std::apply(
          [&](auto&... unpacked) { return checkpoint(*region, with_owner, owner, unpacked...); },
          args));
    } else {
      InnerCandidates markers(request.inner_candidates, reached);
      const CandidateRunnerScope scope(&markers);
      result.emplace(apply_forward(fn, args));
    }
  } catch (...) {
    runner->abandon();
    throw;
  }
  request.inner_markers = reached->load();
  // What the region dropped is not held here either.
  const std::vector<at::Tensor> none(tensors.size());
  TensorCursor cleared(none);
  replace_tensors(args, cleared);
  tensors.clear();
  collect_tensors(*result, tensors);
  runner->end(tensors, request);
  TensorCursor out(tensors);
  replace_tensors(*result, out);
  return std::move(*result);
}

}  // namespace detail

/// Marks `module(args...)` as a candidate: a block whose storage (kept, checkpointed, selective,
/// offloaded) `ckpt::PlannedModel` chooses. Write it in your own `forward`, where you would call
/// the block; it returns what the block's `forward` returns. The candidate is named after the
/// module's path in the planned model ("encoder.2"). A candidate may take and return several
/// tensors, tuples, vectors and values, and sit anywhere: inside a residual block, in both arms of
/// a U-Net. Markers reached while a candidate runs are its parts: the planner may run them as
/// regions inside it ("checkpointed, parts checkpointed"), never on their own. Without a
/// `PlannedModel` at work (or under `torch::NoGradGuard`) it is `module->forward(args...)`.
///
/// Example:
/// ```
/// struct UpImpl : torch::nn::Module {
///   torch::nn::Conv2d conv{torch::nn::Conv2dOptions(8, 4, 3).padding(1)};
///   UpImpl() { register_module("conv", conv); }
///   torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& skip) {
///     return torch::relu(ckpt::candidate(conv, torch::cat({x, skip}, 1)));
///   }
/// };
/// ```
template <class Module, class... Args,
          std::enable_if_t<detail::IsModuleHandle<std::decay_t<Module>>::value, int> = 0>
auto candidate(Module&& module, Args&&... args) {
  if constexpr (!detail::HasForward<Module, std::tuple<Args...>>::value) {
    static_assert(detail::HasForward<Module, std::tuple<Args...>>::value,
                  "ckpt::candidate: this module has no forward() taking these arguments. A "
                  "std::shared_ptr<torch::nn::Module> (what layers[i] and layers->ptr(i) give) "
                  "has none: pass layers->ptr<YourBlockImpl>(i), the AnyModule a Sequential "
                  "holds, or mark the whole container with ckpt::candidates(layers, x).");
  } else {
    using Result = detail::CandidateResult<Module, Args...>;
    detail::CandidateRunner* runner = detail::active_candidate_runner();
    if (runner == nullptr)
      return Result(detail::invoke_forward(0, module, std::forward<Args>(args)...));
    std::decay_t<Module> handle(std::forward<Module>(module));
    std::tuple<std::decay_t<Args>...> held(std::forward<Args>(args)...);
    return detail::run_as_candidate(runner, std::string(), detail::module_pointer(handle), handle,
                                    held);
  }
}

/// Marks a `Sequential`'s element (the `AnyModule` iterating one gives) as a candidate named after
/// its module's path; its forward must return a tensor. The same as the module form otherwise.
///
/// Example:
/// ```
/// torch::nn::Sequential stage(torch::nn::Linear(8, 8), torch::nn::ReLU());
/// auto x = torch::randn({2, 8});
/// for (const torch::nn::AnyModule& layer : *stage) x = ckpt::candidate(layer, x);
/// ```
template <class... Args>
at::Tensor candidate(const torch::nn::AnyModule& module, Args&&... args) {
  TORCH_CHECK(!module.is_empty(), "ckpt::candidate: the AnyModule is empty; give it a module.");
  detail::CandidateRunner* runner = detail::active_candidate_runner();
  // AnyModule::forward is not const, though it changes nothing of the AnyModule itself.
  if (runner == nullptr)
    return const_cast<torch::nn::AnyModule&>(module).forward(std::forward<Args>(args)...);
  auto forward = [module](auto&&... values) {
    return const_cast<torch::nn::AnyModule&>(module).forward(
        std::forward<decltype(values)>(values)...);
  };
  std::tuple<std::decay_t<Args>...> held(std::forward<Args>(args)...);
  return detail::run_as_candidate(runner, std::string(), module.ptr(), forward, held);
}

/// Marks `fn(args...)`, a part of the module `owner`'s own forward, as the candidate
/// "<owner's path>.<part>": the way to cut a block inside (both convolutions of a residual block,
/// say), one line per part, written once for every instance of the block. A recompute leaves
/// `owner`'s buffers as the forward left them.
///
/// Example:
/// ```
/// struct BlockImpl : torch::nn::Module {
///   torch::nn::Linear fc{8, 8};
///   BlockImpl() { register_module("fc", fc); }
///   torch::Tensor forward(const torch::Tensor& x) {
///     auto h = ckpt::candidate(*this, "fc", [this](const torch::Tensor& t) { return fc(t); }, x);
///     return x + torch::relu(h);
///   }
/// };
/// ```
template <class F, class... Args>
auto candidate(torch::nn::Module& owner, const std::string& part, F&& fn, Args&&... args) {
  using Result = detail::CandidateResult<F, Args...>;
  detail::CandidateRunner* runner = detail::active_candidate_runner();
  if (runner == nullptr) return Result(detail::invoke_forward(0, fn, std::forward<Args>(args)...));
  std::decay_t<F> callable(std::forward<F>(fn));
  std::tuple<std::decay_t<Args>...> held(std::forward<Args>(args)...);
  return detail::run_as_candidate(runner, part, owner.shared_from_this(), callable, held);
}

/// Marks `fn(args...)` as the candidate `name` (see the module form above). Pass the tensors the
/// block reads as `args`: the planner tracks them (a checkpointed candidate keeps them until its
/// backward). Modules `fn` captures have their buffers kept from a second update, as in
/// `ckpt::checkpoint`.
///
/// Example:
/// ```
/// auto y = ckpt::candidate("attention", [&](const torch::Tensor& h) { return attn(h); }, x);
/// ```
template <class F, class... Args>
auto candidate(const std::string& name, F&& fn, Args&&... args) {
  using Result = detail::CandidateResult<F, Args...>;
  detail::CandidateRunner* runner = detail::active_candidate_runner();
  if (runner == nullptr) return Result(detail::invoke_forward(0, fn, std::forward<Args>(args)...));
  std::decay_t<F> callable(std::forward<F>(fn));
  std::tuple<std::decay_t<Args>...> held(std::forward<Args>(args)...);
  return detail::run_as_candidate(runner, name, std::shared_ptr<torch::nn::Module>(), callable,
                                  held);
}

/// Runs the blocks of `blocks` in order, each as a candidate (`x = candidate(block, x)` for every
/// block): a whole `ModuleList` marked in one line. `Block` is the blocks' module class (the
/// `...Impl`); each block's `forward` takes and returns one tensor.
///
/// Example:
/// ```
/// struct TowerImpl : torch::nn::Module {
///   torch::nn::ModuleList layers;
///   TowerImpl() {
///     for (int i = 0; i < 4; ++i) layers->push_back(torch::nn::Linear(8, 8));
///     register_module("layers", layers);
///   }
///   torch::Tensor forward(torch::Tensor x) {
///     return ckpt::candidates<torch::nn::LinearImpl>(layers, x);
///   }
/// };
/// ```
template <class Block>
at::Tensor candidates(const torch::nn::ModuleList& blocks, at::Tensor x) {
  for (size_t i = 0; i < blocks->size(); ++i) {
    std::shared_ptr<Block> block = std::dynamic_pointer_cast<Block>(blocks->ptr(i));
    TORCH_CHECK(block != nullptr, "ckpt::candidates: block ", i, " of the ModuleList is a ",
                blocks->ptr(i)->name(), ", not the Block type given.");
    x = candidate(block, x);
  }
  return x;
}

/// Runs the elements of `blocks` in order, each as a candidate: a ResNet's stage, or any
/// `Sequential`, marked in one line. Each element's `forward` takes and returns one tensor.
///
/// Example:
/// ```
/// struct NetImpl : torch::nn::Module {
///   torch::nn::Sequential stage{torch::nn::Linear(8, 8), torch::nn::ReLU(), torch::nn::Linear(8,
///   8)}; NetImpl() { register_module("stage", stage); } torch::Tensor forward(const torch::Tensor&
///   x) { return ckpt::candidates(stage, x); }
/// };
/// ```
inline at::Tensor candidates(const torch::nn::Sequential& blocks, at::Tensor x) {
  for (const torch::nn::AnyModule& block : *blocks) x = candidate(block, x);
  return x;
}

}  // namespace ckpt
