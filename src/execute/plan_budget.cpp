#include "plan_budget.h"

#include "out_of_memory.h"

#include <c10/util/StringUtil.h>

#include <algorithm>
#include <cmath>

namespace ckpt {
namespace detail {

int64_t smallest_budget(const BudgetLimits& limits) {
  TORCH_CHECK(limits.headroom >= 0.0 && limits.headroom < 0.5, limits.planner,
              ": headroom must be in [0, 0.5), a share of the budget to leave free; got ",
              limits.headroom, ".");
  // The smallest plan's peak with its headroom, but never above the plain step's measured peak.
  const auto with_headroom = static_cast<int64_t>(
      std::ceil(static_cast<double>(limits.smallest_peak_bytes) / (1.0 - limits.headroom)));
  return std::min(with_headroom, limits.plain_peak_bytes);
}

ResolvedBudget resolve_budget(const Budget& requested, const BudgetLimits& limits,
                              bool fall_back_to_minimum, const InfeasibleError& infeasible) {
  ResolvedBudget budget;
  budget.smallest = smallest_budget(limits);
  budget.bytes = requested.resolve(limits.plain_peak_bytes, budget.smallest);
  if (budget.bytes < budget.smallest && infeasible) {
    if (!fall_back_to_minimum) throw infeasible(budget.bytes, budget.smallest);
    TORCH_WARN(limits.planner, ": no plan fits in a budget of ", budget.bytes,
               " bytes; planning for the smallest feasible budget, ", budget.smallest, " bytes.");
    budget.bytes = budget.smallest;
  }
  budget.fits_plain_step = budget.bytes >= limits.plain_peak_bytes;
  const auto usable =
      static_cast<int64_t>(static_cast<double>(budget.bytes) * (1.0 - limits.headroom));
  // The headroom never takes a budget below the smallest plan's peak (nor one left below it).
  budget.solved_for = budget.fits_plain_step
                          ? budget.bytes
                          : std::max(usable, std::min(limits.smallest_peak_bytes, budget.bytes));
  return budget;
}

void plan_for_less(const char* planner, c10::OutOfMemoryError& error, bool in_backward,
                   std::optional<int64_t> held_bytes, int64_t failed_budget_bytes,
                   int64_t failed_peak_bytes, int64_t smallest_bytes,
                   const std::function<int64_t(int64_t budget_bytes)>& solve) {
  const int64_t next =
      std::max(smallest_bytes, budget_after_out_of_memory(failed_peak_bytes, held_bytes));
  const int64_t peak = solve(next);
  if (peak >= failed_peak_bytes) {  // no plan leaves more room
    explain_no_smaller_plan(error, planner, failed_budget_bytes, failed_peak_bytes, smallest_bytes);
    throw error;
  }
  TORCH_WARN(replanned_message(planner, in_backward ? "backward" : "forward", error,
                               failed_budget_bytes, next, peak));
}

void on_input_change(const char* planner, InputChange policy, const std::string& change,
                     const std::string& advice) {
  TORCH_CHECK(policy == InputChange::Replan, planner, ": ", change, ". ", advice);
  TORCH_WARN(planner, ": ", change,
             "; planning again: this step profiles and solves first, so it takes several steps' "
             "time.");
}

StepConditions StepConditions::current(const torch::nn::Module& model,
                                       c10::DeviceType device_type) {
  StepConditions conditions;
  model.apply([&conditions](const torch::nn::Module& module) {
    conditions.training.push_back(module.is_training());
  });
  for (const auto& parameter : model.parameters()) {
    conditions.requires_grad.push_back(parameter.requires_grad());
  }
  conditions.autocast = AutocastState::current(device_type);
  return conditions;
}

std::string StepConditions::change_from(const StepConditions& planned,
                                        const char* model_name) const {
  std::vector<std::string> changes;
  if (training != planned.training) {
    changes.push_back(c10::str(model_name,
                               "'s modules are not in the training modes it was planned in "
                               "(dropout and batch norm keep other tensors in each mode)"));
  }
  if (requires_grad != planned.requires_grad) {
    changes.push_back(c10::str(model_name,
                               "'s parameters do not require grad as when it was planned (a "
                               "frozen layer keeps nothing for its weights' gradients)"));
  }
  if (!(autocast == planned.autocast)) {
    changes.push_back(
        "autocast is not as when it was planned (it changes the dtype of what it "
        "casts)");
  }
  return c10::Join("; ", changes);
}

}  // namespace detail
}  // namespace ckpt
