#pragma once

/// \file
/// `ckpt::PlannedModel`: any model whose `forward` marks candidates (`ckpt::candidate`), trained
/// under the fastest choice of storage modes that fits a memory budget.

#include <ckpt/candidate.h>
#include <ckpt/model_profiler.h>
#include <ckpt/plan/model.h>
#include <ckpt/planned_sequential.h>
#include <ckpt/selective.h>
#include <ckpt/storage_mode.h>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ckpt {
namespace detail {
class StepStart;
struct StepConditions;
}  // namespace detail

/// Options of `PlannedModel`.
struct PlannedModelOptions {
  /// The storage modes a candidate may run in, beside keeping everything. Default:
  /// `StorageModes::defaults()` ("checkpointed", "selective", and "offloaded" on accelerators;
  /// `StorageModes::standard()` adds "two_pass")
  TORCH_ARG(StorageModes, storage_modes) = StorageModes::defaults();
  /// The policy of the "selective" mode; an empty one turns it off. Default: `save_matmuls()`
  TORCH_ARG(SelectivePolicy, selective_policy) = save_matmuls();
  /// Host memory the "offloaded" mode may hold at once, in bytes: in planned steps, and in the
  /// profiling steps (`ModelProfileOptions::host_budget_bytes`). Default: unlimited
  TORCH_ARG(int64_t, host_budget_bytes) = std::numeric_limits<int64_t>::max();
  /// When the budget is below the smallest feasible one, plan for that one with a warning instead
  /// of raising `InfeasibleBudget`. Default: false
  TORCH_ARG(bool, fall_back_to_minimum) = false;
  /// What a step whose candidates differ from the profiled step's does: other candidates, in
  /// another order, or an input larger in some dimension (or of another dtype or device, or
  /// requiring grad where the profiled one did not), or modules in other training modes,
  /// parameters frozen or unfrozen since, or autocast switched.
  /// `InputChange::Replan` profiles the step again and solves again, with a warning;
  /// `InputChange::Error` raises an error that says what changed. Either way the step's state
  /// (buffers, RNG) is put back first. Default: `InputChange::Replan`
  TORCH_ARG(InputChange, on_input_change) = InputChange::Replan;
  /// What a step that runs out of device memory does (see `OutOfMemory`). With `Replan`, `run`
  /// keeps `loss_fn` until the loss's backward ends, to run the step again if the backward runs
  /// out (so what it captures must outlive that backward), and keeps a host copy of the parameter
  /// gradients that exist before the step (none after `zero_grad()`). Default: `OutOfMemory::Raise`
  TORCH_ARG(OutOfMemory, on_out_of_memory) = OutOfMemory::Raise;
  /// Whether each step's backward creates the parameter gradients, as after `zero_grad()`, so
  /// that the budget counts them. Default: true
  TORCH_ARG(bool, count_parameter_gradients) = true;
  /// Replay each recomputed candidate's RNG. Default: true
  TORCH_ARG(bool, preserve_rng_state) = true;
  /// Offer the "recomputed" mode (`ModelProfileOptions::recompute_outputs`): a candidate whose
  /// outputs the candidates that take them don't keep, but compute again in their backward.
  /// Default: true
  TORCH_ARG(bool, recompute_outputs) = true;
  /// The longest chain of "recomputed" candidates offered
  /// (`ModelProfileOptions::max_recompute_chain`). Default: 4
  TORCH_ARG(int, max_recompute_chain) = 4;
  /// Measure the options that save memory for more recompute, the "recomputed" chains (most of
  /// a first step's profiling: about L + 1 steps for each length L, against one per storage
  /// mode) and candidates with their parts checkpointed, only as far as the budget needs: the
  /// first step measures the plain step and the storage modes, then the parts, then chains one
  /// length longer (`ModelProfiler::measure_more`), only while no plan of what is measured fits
  /// the budget. A plan may then be slower than the fastest of every option (a recomputed
  /// candidate that would let a neighbour keep everything); `Budget::minimum()` and
  /// `OutOfMemory::Replan` (whose plans for less need the smallest) measure every option.
  /// Default: true
  TORCH_ARG(bool, measure_as_needed) = true;
  /// The share of the budget a plan leaves free: it is solved for `(1 - headroom)` times the
  /// budget (the smallest feasible budget grows to match). The measured peak has come out a few
  /// KiB above the prediction (0.02% on the bench U-Net, bench/results.md "Any model"); this keeps
  /// such errors inside the budget. Must be in [0, 0.5). Default: 0.0025
  TORCH_ARG(double, headroom) = 0.0025;
  /// The solver's search limit (`plan::ModelSolverOptions::max_exact_nodes`). Default: 25,000
  TORCH_ARG(int64_t, max_exact_nodes) = 25'000;
  /// How much slower than the fastest plan a plan may be where the exact search stops at its
  /// limit (`plan::ModelSolverOptions::relative_gap`). Default: 0.01
  TORCH_ARG(double, relative_gap) = 0.01;
};

/// Trains any model under a memory budget. Its `forward` marks the blocks the planner may
/// choose for, one line each (`x = ckpt::candidate(block, x);`); the first `run` profiles one
/// training step (each candidate's time and the bytes it keeps in each storage mode, on the
/// step's memory timeline, docs/memory-model.md "Any model"), solves for the fastest storage mode
/// of each candidate whose predicted peak fits the budget, and runs the step so. Later steps run
/// the same plan: a step whose candidates or their input shapes grow or change is re-planned or
/// refused (`PlannedModelOptions::on_input_change`), never run on a stale plan; the last three
/// plans re-planning replaced are kept (but those the new plan runs the steps of), and a step one
/// of them was made for runs under it again without profiling (sequences of a few lengths).
/// Gradients and buffers are those of the plain step; RNG is replayed. Percentages are of the
/// plain step's measured peak; "min" is the smallest feasible budget; a budget below it raises
/// `InfeasibleBudget`, which carries it; at a budget that holds the plain step, a plan
/// predicted no faster than it runs the plain step (every candidate stored). One thread runs a
/// `PlannedModel` at a time.
///
/// Example:
/// ```
/// ckpt::PlannedModel planned(model, ckpt::Budget::parse("50%"));
/// torch::Tensor loss = planned.run([&] { return model->forward(x).pow(2).mean(); });
/// loss.backward();
/// ```
class PlannedModel {
 public:
  PlannedModel(std::shared_ptr<torch::nn::Module> model, Budget budget,
               PlannedModelOptions options = {});
  template <class M>
  PlannedModel(const torch::nn::ModuleHolder<M>& model, Budget budget,
               PlannedModelOptions options = {})
      : PlannedModel(std::shared_ptr<torch::nn::Module>(model.ptr()), budget, std::move(options)) {}

  /// Runs `loss_fn` (the forward to the step's loss) with each candidate in its planned storage
  /// mode and returns the loss; call `backward()` on it. Plans first if needed, running `loss_fn`
  /// several times: each call must compute the same step (read the batch before it). With
  /// `on_out_of_memory(OutOfMemory::Replan)`, a step that runs out of device memory in `run` or
  /// in the loss's `backward()` runs again under a plan for less (`OutOfMemory`); that
  /// backward must be `loss.backward()` (not `torch::autograd::grad`, nor a second backward of
  /// the same loss), and this `PlannedModel` must outlive it.
  at::Tensor run(const std::function<at::Tensor()>& loss_fn);
  /// The step in the two parts a training loop writes: `forward()` gives the model's output,
  /// `loss(output)` the loss, with the output as an lvalue (a loss functor whose parameters are
  /// non-const references takes it as it is). The same as `run([&] { auto output = forward();
  /// return loss(output); })`.
  ///
  /// Example:
  /// ```
  /// torch::nn::CrossEntropyLoss criterion;
  /// auto loss = planned.run([&] { return model->forward(x); },
  ///                         [&](torch::Tensor& logits) { return criterion(logits, labels); });
  /// ```
  template <class Forward, class Loss>
  at::Tensor run(Forward&& forward, Loss&& loss) {
    return run(std::function<at::Tensor()>([&] {
      auto output = forward();
      return at::Tensor(loss(output));
    }));
  }
  /// Profiles the step `loss_fn` (running it several times, state put back) and solves; the plans
  /// kept for other steps go.
  void plan(const std::function<at::Tensor()>& loss_fn);
  /// Solves for a given measurement instead of profiling; the plans kept for other steps go.
  void plan(MeasuredModel measured);

  bool planned() const { return plan_.has_value(); }
  /// The measurement the plan was solved from.
  const MeasuredModel& measured() const;
  /// The chosen option of each candidate and its prediction.
  const plan::ModelPlan& solution() const;
  /// The storage mode of candidate `name` ("stored", "checkpointed", ...; a later call of a
  /// candidate the step reaches more than once is named after its call: "d.0#2").
  const std::string& mode_of(const std::string& name) const;
  /// The budget in bytes the plan was solved for.
  int64_t budget_bytes() const;
  /// The plain step's peak that percentages are of.
  int64_t plain_peak_bytes() const;
  /// A table of the candidates and their modes (and whose offloaded data each brings back
  /// ahead), the predicted time and peak.
  std::string summary() const;

 private:
  struct Plan {
    MeasuredModel measured;
    plan::ModelPlan solution;
    int64_t budget_bytes = 0;
    std::vector<std::optional<CheckpointOptions>> regions;  // per candidate; none: kept
    std::shared_ptr<const detail::CandidateNames> names;    // the model's module paths
    std::vector<bool> recomputable;                         // per candidate: "recomputed"
    // What else the step was profiled under (none for a profile from elsewhere).
    std::shared_ptr<const detail::StepConditions> conditions;
    // Per candidate: its parts (the markers inside it) run as regions of its own mode.
    std::vector<bool> parts_checkpointed;
  };
  class Runner;
  class RetryingBackward;

  at::Tensor run_checked(const std::function<at::Tensor()>& loss_fn);
  at::Tensor run_surviving(const std::function<at::Tensor()>& loss_fn);
  // After the step ran out of memory: puts its state back, plans for less (or adds the figures to
  // `error`, which passes on), and runs the forward again.
  at::Tensor run_again(c10::OutOfMemoryError& error, detail::StepStart& start,
                       const std::function<at::Tensor()>& loss_fn, bool in_backward);
  void replan_for_less(c10::OutOfMemoryError& error, std::optional<int64_t> held_bytes,
                       bool in_backward);
  at::Tensor run_planned(const std::function<at::Tensor()>& loss_fn);
  // Profiles the step `loss_fn` and solves: the plan, not yet the current one.
  Plan profile_and_solve(const std::function<at::Tensor()>& loss_fn) const;
  // Whether some plan of `profile`'s options fits the budget, its headroom included.
  bool fits_budget(const plan::ModelProfile& profile) const;
  // Solves `measured` for `budget`: the plan, not yet the current one.
  Plan make_plan(MeasuredModel measured, const Budget& budget) const;
  const Plan& current() const;

  std::shared_ptr<torch::nn::Module> model_;
  Budget budget_;
  PlannedModelOptions options_;
  std::optional<Plan> plan_;
  std::vector<Plan> other_plans_;  // made for steps that reached other candidates or shapes
};

}  // namespace ckpt
