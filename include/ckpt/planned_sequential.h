#pragma once

/// \file
/// `ckpt::PlannedSequential`: a chain of modules run under the fastest schedule that fits a
/// memory budget. The execution layer: it plans through the measurement layer's profiler
/// interface (`ckpt::ChainProfiler`, <ckpt/profiler.h>), below it.

#include <ckpt/model_profiler.h>
#include <ckpt/plan/chain.h>
#include <ckpt/plan/schedule.h>
#include <ckpt/plan/simulator.h>
#include <ckpt/plan/spec.h>
#include <ckpt/profiler.h>
#include <ckpt/selective.h>
#include <ckpt/storage_mode.h>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>
#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

namespace ckpt {
namespace detail {
struct OptionForwards;  // how the executor runs each storage option of the profile
class ScheduleRunner;   // one forward and backward of the chain under a schedule
}  // namespace detail

/// A memory budget: bytes ("512MiB"), a percentage of the chain's no-checkpoint peak ("40%"),
/// or its smallest feasible budget ("min"). The planning layer's type; its parse errors are
/// std::invalid_argument.
using Budget = plan::Budget;

/// Raised when no schedule of the chain fits the budget; carries the smallest budget that fits.
class InfeasibleBudget : public c10::Error {
 public:
  InfeasibleBudget(int64_t budget_bytes, int64_t smallest_feasible_bytes);
  /// The budget fits with more host memory for offloading: `smallest_host_budget_bytes` of it.
  InfeasibleBudget(int64_t budget_bytes, int64_t smallest_feasible_bytes, int64_t host_budget_bytes,
                   int64_t smallest_host_budget_bytes);
  /// Another planner's message (`ckpt::PlannedModel`'s), with the smallest feasible budget.
  InfeasibleBudget(const std::string& message, int64_t smallest_feasible_bytes);
  /// The smallest budget, in bytes, that a schedule of the chain fits in (with the host budget
  /// given).
  int64_t smallest_feasible_bytes() const { return smallest_feasible_bytes_; }
  /// The smallest host budget with which the budget fits, or -1 where more host memory would not
  /// help.
  int64_t smallest_host_budget_bytes() const { return smallest_host_budget_bytes_; }

 private:
  int64_t smallest_feasible_bytes_;
  int64_t smallest_host_budget_bytes_ = -1;
};

/// What `PlannedSequential` does with an input its plan may not hold: larger than the sample it
/// planned from in some dimension, of another dtype, device or number of dimensions, or requiring
/// grad where the sample did not (the first stage then keeps more for its backward); and with
/// modules in other training modes than when it planned (dropout and batch norm keep other
/// tensors in each mode), parameters frozen or unfrozen since, or autocast switched. (An input no
/// larger in any dimension runs the plan: its activations are no larger.) The last few plans are
/// kept: a step like one of theirs runs it again.
enum class InputChange {
  /// Profiles the chain on the input and solves again, with a warning that says why the step
  /// takes longer; the budget in bytes stays, a percentage is of the new plain peak.
  Replan,
  /// Raises an error, keeping the plan: plan with a sample of the largest input instead.
  Error,
};

/// What a planned step does when the device runs out of memory (LibTorch's
/// `c10::OutOfMemoryError`) in its forward or its backward: a plan is a prediction, and the
/// memory left to the step may be less than it was when the plan was made.
enum class OutOfMemory {
  /// The error passes on, as from any step.
  Raise,
  /// The step survives: what it made is let go of, its state (RNG, module buffers, parameter
  /// gradients) is put back as it was before the step, the budget is lowered to what the failed
  /// step held on the device when it ran out (or, where that can't be measured, below the
  /// current plan's predicted peak), the step runs again under the plan for that budget, and the
  /// new plan stays, with a warning of one line. Gradients, buffers and RNG end as those of a run
  /// that planned the smaller budget from the start, to the bit. Where the plan is already the
  /// smallest feasible one, the error passes on with the plan's figures added.
  Replan,
};

/// Options for `PlannedSequential`.
struct PlannedSequentialOptions {
  /// The solver, as `plan::SolverSpec` reads it: "optimal" (rotor's dynamic program),
  /// "uniform:K" (checkpoint_sequential with K segments), "sqrt" (Chen's √n), "revolve:S",
  /// "none"; "uniform" and "revolve" alone pick the fastest of their family that fits.
  /// Default: "optimal"
  TORCH_ARG(std::string, solver) = "optimal";
  /// Memory slots of the optimal solver's discretisation. Default: 500
  TORCH_ARG(int, slots) = 500;
  /// What `plan(sample)` measures the chain with; none: a `ckpt::MeasuringProfiler` with these
  /// options' storage modes, settings and `count_parameter_gradients`. Default: none
  TORCH_ARG(std::shared_ptr<ChainProfiler>, profiler) = nullptr;
  /// Replay each stage's RNG state when it is recomputed, leaving the caller's random streams
  /// where they were. Off: recomputes draw from the caller's streams, as Python's
  /// `preserve_rng_state=False` does. Default: true
  TORCH_ARG(bool, preserve_rng_state) = true;
  /// When the budget is below the smallest feasible one, plan for that one with a warning instead
  /// of raising `InfeasibleBudget`. Default: false
  TORCH_ARG(bool, fall_back_to_minimum) = false;
  /// The share of a budget below the no-checkpoint peak that the optimal solver leaves free, in
  /// [0, 0.5): room for what the profile did not see (the any-model planner's default is 0.0025;
  /// a chain's profile predicts its peak within a fraction of that). Default: 0
  TORCH_ARG(double, headroom) = 0.0;
  /// The storage modes a stage may use (`ckpt::StorageModes`): the profiler measures each, the
  /// solver may choose any, and the executor runs the stages of a profile's options with them.
  /// A profile from elsewhere must name its options after these. Default:
  /// `StorageModes::defaults()`
  TORCH_ARG(StorageModes, storage_modes) = StorageModes::defaults();
  /// Host memory the "offloaded" storage mode may hold at once, in bytes: the solver keeps the
  /// plan's host peak within it (docs/memory-model.md, "Offloading"). Default: unlimited
  TORCH_ARG(int64_t, host_budget_bytes) = std::numeric_limits<int64_t>::max();
  /// The policy of the "selective" storage mode: a stage the schedule runs that way is a
  /// checkpointed region under this policy. An empty policy turns the mode off. A profiler you
  /// supply must measure with the same one. Default: `save_matmuls()`
  TORCH_ARG(SelectivePolicy, selective_policy) = save_matmuls();
  /// Whether each step's backward creates the parameter gradients, as after `zero_grad()` (which
  /// sets them to none, the default since LibTorch 2.0) and in any first step, so that the budget
  /// counts them. False where they exist before every step (`zero_grad(false)`): the budget is
  /// then for what the step adds to them. `ckpt::PlannedSequential` measures with it; a profiler
  /// you supply decides for itself. Default: true
  TORCH_ARG(bool, count_parameter_gradients) = true;
  /// What an input the plan may not hold does (see `InputChange`). A plan made from a given
  /// profile (`plan(profile)`) runs any input. Default: `InputChange::Replan`
  TORCH_ARG(InputChange, on_input_change) = InputChange::Replan;
  /// What a step that runs out of device memory does (see `OutOfMemory`). With `Replan`, the
  /// chain's backward keeps its input until the backward ends, to run the chain again if it must,
  /// each forward copies the chain's buffers and (to the host) the parameter gradients that exist
  /// (none after `zero_grad()`), and the chain's backward runs in a node of its own (so this
  /// module must outlive it). Default: `OutOfMemory::Raise`
  TORCH_ARG(OutOfMemory, on_out_of_memory) = OutOfMemory::Raise;
};

namespace detail {
/// Sizes, dtype, device and requires-grad of the input a plan was profiled with
/// (`TensorShape::holds` tells whether an input needs no more memory).
using InputSignature = TensorShape;

struct StepConditions;  // src/execute/plan_budget.h

/// One plan of the chain: the profile it was solved from and what the executor runs.
struct ChainPlan {
  /// The stages the profile measured and the executor runs: the chain's own, except that a
  /// stage that writes into its input runs together with the one before it.
  std::vector<torch::nn::AnyModule> stages;
  plan::Chain profile;
  std::shared_ptr<const OptionForwards> option_forwards;  // how each storage option runs
  plan::Schedule schedule;
  plan::SimulationResult prediction;
  int64_t budget_bytes = 0;
  int64_t no_checkpoint_peak_bytes = 0;
  bool keeps_everything = false;  // the schedule recomputes nothing: forward runs the plain chain
  std::optional<InputSignature> input;  // none for a plan from a given profile
  /// What else the chain was profiled under (training modes, parameters requiring grad,
  /// autocast); none for a plan from a given profile.
  std::shared_ptr<const StepConditions> conditions;
};
}  // namespace detail

/// Receives every operation of a schedule as the executor runs it (for traces and plots).
struct ExecutionObserver {
  virtual ~ExecutionObserver() = default;
  virtual void on_op_begin(const plan::Op& /*op*/) {}
  virtual void on_op_end(const plan::Op& /*op*/) {}
};

/// Runs a chain of modules under the fastest schedule that fits a memory budget.
///
/// On the first forward (or an explicit `plan(sample)`), it profiles the chain on the input,
/// measures the peak of one plain step, solves for a schedule under the budget and keeps it;
/// every forward/backward then follows that schedule, for every input no larger than the sample
/// (an input larger in some dimension, of another dtype or device, or requiring grad where the
/// sample did not, is planned for again or refused: `PlannedSequentialOptions::on_input_change`).
/// Percentages are of that measured peak; at a budget that holds it, the chain runs plainly (no
/// recomputation, nothing added). Gradients are identical to the unchecked chain; RNG is replayed
/// and buffers are not updated twice. If no schedule fits, `plan` raises `InfeasibleBudget`, which
/// carries the smallest feasible budget (or, with `fall_back_to_minimum`, plans for it with a
/// warning); `Budget::minimum()` asks for it directly. The chain's modules are registered as
/// children "0", "1", ... as in the Sequential.
///
/// Example:
/// ```
/// ckpt::PlannedSequential planned(model, ckpt::Budget::parse("40%"));
/// auto loss = planned(x).sum();
/// loss.backward();
/// ```
class PlannedSequentialImpl : public torch::nn::Module {
 public:
  PlannedSequentialImpl(const torch::nn::Sequential& chain, Budget budget,
                        PlannedSequentialOptions options = {});

  /// Runs the chain under the schedule; plans first if needed.
  torch::Tensor forward(const torch::Tensor& input);
  /// Profiles the chain on `sample_input` and solves for a schedule under the budget.
  void plan(const torch::Tensor& sample_input);
  /// Uses a given profile instead of measuring one, then solves. Percentages are then of the
  /// profile's predicted no-checkpoint peak.
  void plan(const plan::Chain& profile);

  bool planned() const;
  const plan::Chain& profile() const;
  const plan::Schedule& schedule() const;
  /// The simulator's prediction for the schedule (time, peak bytes, forward count).
  const plan::SimulationResult& prediction() const;
  /// The budget in bytes the schedule was solved for.
  int64_t budget_bytes() const;
  /// The no-checkpoint peak percentages refer to: measured by `plan(sample)`, predicted from
  /// the profile by `plan(profile)`.
  int64_t no_checkpoint_peak_bytes() const;

  void set_observer(std::shared_ptr<ExecutionObserver> observer) {
    observer_ = std::move(observer);
  }
  void pretty_print(std::ostream& stream) const override;

  PlannedSequentialOptions options;

 private:
  void check_profile(const plan::Chain& profile) const;
  std::shared_ptr<detail::ChainPlan> solve(std::vector<torch::nn::AnyModule> stages,
                                           const plan::Chain& profile,
                                           int64_t no_checkpoint_peak_bytes,
                                           const Budget& budget) const;
  std::shared_ptr<detail::ChainPlan> measure_and_solve(const torch::Tensor& sample_input) const;
  /// The plan for `input`: the current one when it holds the input, else a new one (or an
  /// error), as `options.on_input_change()` says.
  std::shared_ptr<const detail::ChainPlan> plan_for(const torch::Tensor& input);
  const detail::ChainPlan& planned_or_error() const;
  /// With OutOfMemory::Replan: what runs the chain again from `input` after it ran out of device
  /// memory under `plan` (the state of the step's start put back, under a plan for less).
  std::function<std::pair<std::shared_ptr<detail::ScheduleRunner>, at::Tensor>(
      c10::OutOfMemoryError&, bool in_backward)>
  run_again_function(const torch::Tensor& input, std::shared_ptr<const detail::ChainPlan> plan);
  /// The plan for less after the chain ran out of memory under `failed`, or `error` with the
  /// failed plan's figures added where none leaves more room.
  std::shared_ptr<const detail::ChainPlan> replan_for_less(c10::OutOfMemoryError& error,
                                                           const detail::ChainPlan& failed,
                                                           std::optional<int64_t> held_bytes,
                                                           bool in_backward);

  std::vector<torch::nn::AnyModule> stages_;
  Budget budget_;
  mutable std::mutex mutex_;  // guards plan_: a forward may plan again
  std::shared_ptr<const detail::ChainPlan> plan_;
  /// Plans made for other kinds of step (the other training mode, a larger input), the most
  /// recent last: a step of such a kind runs its plan again instead of profiling.
  std::vector<std::shared_ptr<const detail::ChainPlan>> other_plans_;
  std::shared_ptr<ExecutionObserver> observer_;
};

/// The `ModuleHolder` of `PlannedSequentialImpl` (`TORCH_MODULE(PlannedSequential)`).
TORCH_MODULE(PlannedSequential);

}  // namespace ckpt
