#pragma once

// What both planners (`PlannedSequential` and `PlannedModel`) do the same way around their
// solvers: resolve the budget asked for against the plain step's peak and the smallest plan's,
// with headroom; answer a budget no plan fits; plan for less after the device ran out of memory;
// decide what an input the plan was not made for does, and keep the plans made for other inputs.

#include <ckpt/planned_sequential.h>

#include "autograd/autocast_state.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ckpt {
namespace detail {

/// What a budget is resolved against.
struct BudgetLimits {
  /// Names the planner in messages: "ckpt::PlannedModel".
  const char* planner = "";
  /// The plain step's peak. It was measured, so a plan that keeps everything fits in it without
  /// headroom, even where the planner's model predicts more.
  int64_t plain_peak_bytes = 0;
  /// The smallest peak any plan is predicted to reach.
  int64_t smallest_peak_bytes = 0;
  /// The share of a budget below the plain peak that a plan leaves free, for what the
  /// prediction does not see.
  double headroom = 0.0;
};

/// A budget resolved: the bytes it is, the smallest that a plan fits in (headroom included), and
/// what the solver is asked for (`bytes` less the headroom, never below the smallest peak).
struct ResolvedBudget {
  int64_t bytes = 0;
  int64_t smallest = 0;
  int64_t solved_for = 0;
  /// Whether the plain step fits (its measured peak is within `bytes`): PlannedSequential then
  /// keeps everything without solving, PlannedModel unless a plan is predicted faster.
  bool fits_plain_step = false;
};

/// The error for a budget below the smallest that fits (`bytes`, `smallest`).
using InfeasibleError = std::function<InfeasibleBudget(int64_t bytes, int64_t smallest)>;

/// `requested` in bytes under `limits`. A budget below the smallest raises `infeasible(...)`, or
/// with `fall_back_to_minimum`, warns and is the smallest; without `infeasible` (a solver that
/// answers any budget its own way), it stays as asked. A headroom outside [0, 0.5) is an error.
ResolvedBudget resolve_budget(const Budget& requested, const BudgetLimits& limits,
                              bool fall_back_to_minimum, const InfeasibleError& infeasible);

/// The smallest budget under `limits`, headroom included.
int64_t smallest_budget(const BudgetLimits& limits);

/// OutOfMemory::Replan's next plan, after the step under a plan for `failed_budget_bytes`,
/// predicted to peak at `failed_peak_bytes`, ran out of device memory with `error` (holding
/// `held_bytes` where known): `solve(budget)` makes the plan for a budget below that prediction
/// (never below `smallest_bytes`) and answers its predicted peak; the next plan must leave more
/// room, or `error` passes on with the failed plan's figures. Warns with one line where it does.
void plan_for_less(const char* planner, c10::OutOfMemoryError& error, bool in_backward,
                   std::optional<int64_t> held_bytes, int64_t failed_budget_bytes,
                   int64_t failed_peak_bytes, int64_t smallest_bytes,
                   const std::function<int64_t(int64_t budget_bytes)>& solve);

/// What, beside its inputs, decides what a step keeps for the backward, and so which steps a plan
/// holds for: each module's training flag (dropout keeps its masks only in training), each
/// parameter's requires_grad (a frozen layer keeps nothing for its weights' gradients) and
/// autocast (which changes the dtype of what it casts).
struct StepConditions {
  std::vector<bool> training;       // `Module::apply` order
  std::vector<bool> requires_grad;  // `Module::parameters()` order
  AutocastState autocast;

  bool operator==(const StepConditions& other) const {
    return training == other.training && requires_grad == other.requires_grad &&
           autocast == other.autocast;
  }
  /// The calling thread's conditions for `model` on `device_type`.
  static StepConditions current(const torch::nn::Module& model, c10::DeviceType device_type);
  /// What differs from `planned` (the conditions a plan was profiled under), as a clause about
  /// `model_name` ("the chain"); empty where nothing does.
  std::string change_from(const StepConditions& planned, const char* model_name) const;
};

/// How many plans for other inputs a planner keeps beside its current one.
constexpr size_t kOtherPlansKept = 3;

/// Makes `next`, planned for an input the current plan was not made for, the current plan. The
/// one it replaces is kept among `others` (the oldest goes where `kOtherPlansKept` are kept
/// already), so that a step on its input again runs it without profiling (batches of a few
/// sizes, sequences of a few lengths), unless `next` runs every step it was made for
/// (`serves(next, plan)`: a plan for a larger batch runs a smaller one); kept plans that `next`
/// serves go too.
template <class Plan, class Serves>
void replace_current_plan(std::vector<Plan>& others, Plan& current, Plan next,
                          const Serves& serves) {
  others.erase(std::remove_if(others.begin(), others.end(),
                              [&](const Plan& kept) { return serves(next, kept); }),
               others.end());
  if (!serves(next, current)) {
    if (others.size() == kOtherPlansKept) others.erase(others.begin());
    others.push_back(std::move(current));
  }
  current = std::move(next);
}

/// Makes the first of `others` that `fits` accepts the current plan (`fits` is called with it in
/// `current`), keeping the one it replaces in its place; false, with `current` as it was, where
/// none does.
template <class Plan, class Fits>
bool switch_to_other_plan(std::vector<Plan>& others, Plan& current, const Fits& fits) {
  using std::swap;
  for (Plan& other : others) {
    swap(other, current);
    if (fits(current)) return true;
    swap(other, current);
  }
  return false;
}

/// What a step whose input the plan was not made for does (`change` says how it differs):
/// raises an error that ends with `advice` under InputChange::Error, and warns that the step
/// plans again under InputChange::Replan.
void on_input_change(const char* planner, InputChange policy, const std::string& change,
                     const std::string& advice);

}  // namespace detail
}  // namespace ckpt
