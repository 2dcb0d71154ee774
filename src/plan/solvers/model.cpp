// The solvers of the model of any network: solve_model (branch and bound seeded by a heuristic),
// min_model_budget, and the brute force the tests hold them to. docs/memory-model.md, "Any model".

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "ckpt/plan/model.h"
#include "model_problem.h"

namespace ckpt {
namespace plan {
namespace {

using detail::ModelBest;
using detail::ModelLimits;
using detail::ModelProblem;

ModelLimits limits_of(const char* function, int64_t budget, const ModelSolverOptions& options) {
  if (options.host_budget_bytes < 0) {
    throw std::invalid_argument(std::string("ckpt::plan::") + function + ": host_budget_bytes " +
                                std::to_string(options.host_budget_bytes) +
                                " is negative; give 0 for no host memory");
  }
  if (options.max_exact_nodes < 0) {
    throw std::invalid_argument(std::string("ckpt::plan::") + function + ": max_exact_nodes " +
                                std::to_string(options.max_exact_nodes) +
                                " is negative; give 0 to use the heuristic alone");
  }
  if (!(options.relative_gap >= 0.0 && options.relative_gap < 1.0)) {
    throw std::invalid_argument(std::string("ckpt::plan::") + function + ": relative_gap " +
                                std::to_string(options.relative_gap) +
                                " is outside [0, 1); give 0.01 to accept 1% over the fastest");
  }
  return ModelLimits{budget, options.host_budget_bytes, options.max_exact_nodes, 0.0};
}

ModelPlan plan_of(const ModelProfile& profile, const ModelProblem& problem, const ModelBest& best,
                  bool exact, double gap) {
  ModelPlan plan;
  plan.exact = exact;
  if (!best.found) return plan;
  plan.gap = gap;
  plan.feasible = true;
  plan.choice = problem.choice(best.positions);
  plan.prediction = simulate_model(profile, plan.choice);
  return plan;
}

// The lowest peak within the host budget: the heuristic's, then branch and bound from it.
ModelBest lowest_peak(const ModelProblem& problem, ModelLimits limits) {
  limits.budget = std::numeric_limits<int64_t>::max();
  ModelBest best = detail::heuristic_lowest_peak(problem, limits);
  detail::search_lowest_peak(problem, limits, best);
  return best;
}

// What a root bound of `bound` extra seconds proves of `best` (found): its step is at most
// (1 + gap) times the fastest's. Infinity without a bound.
double proven_gap(const ModelProblem& problem, const ModelBest& best, double bound) {
  const double least_step = problem.step_time + bound;
  if (!std::isfinite(bound) || least_step <= 0.0) return std::numeric_limits<double>::infinity();
  return std::max(0.0, (problem.step_time + best.time) / least_step - 1.0);
}

// Takes `choice` (a valid one) into `plan` where it fits and beats it.
void consider(const ModelProfile& profile, const std::vector<int>& choice, int64_t budget_bytes,
              int64_t host_budget_bytes, ModelPlan& plan) {
  const ModelPrediction p = simulate_model(profile, choice);
  const bool better = !plan.feasible || p.time < plan.prediction.time ||
                      (p.time == plan.prediction.time && p.peak_bytes < plan.prediction.peak_bytes);
  if (p.peak_bytes <= budget_bytes && p.host_bytes <= host_budget_bytes && better) {
    plan.feasible = true;
    plan.choice = choice;
    plan.prediction = p;
  }
}

}  // namespace

ModelPlan solve_model(const ModelProfile& profile, int64_t budget_bytes,
                      const ModelSolverOptions& options) {
  const ModelLimits limits = limits_of("solve_model", budget_bytes, options);  // gap 0 first
  const ModelProblem problem(profile);
  ModelBest best = detail::heuristic_fastest(problem, limits);
  if (!best.found) {
    // The heuristic can miss a choice that fits where the budget is tight; min_model_budget's
    // search (the same, so any budget it returns is solved) finds one if any fits this budget,
    // and the searches below start from it.
    const ModelBest lowest = lowest_peak(problem, limits);
    if (lowest.peak <= budget_bytes) best = detail::improved(problem, limits, lowest.positions);
  }
  const detail::SearchOutcome outcome = detail::search_fastest(problem, limits, best);
  if (outcome.finished) return plan_of(profile, problem, best, /*exact=*/true, 0.0);
  ModelLimits within = limits;
  within.gap = options.relative_gap;
  if (within.gap > 0.0) {
    const detail::SearchOutcome second = detail::search_fastest(problem, within, best);
    if (second.finished) {
      const double gap = std::min(within.gap, proven_gap(problem, best, outcome.bound));
      return plan_of(profile, problem, best, false, gap);
    }
  }
  return plan_of(profile, problem, best, false, proven_gap(problem, best, outcome.bound));
}

ModelPlan solve_model_brute_force(const ModelProfile& profile, int64_t budget_bytes,
                                  int64_t host_budget_bytes) {
  profile.validate();
  int64_t choices = 1;
  for (const Candidate& candidate : profile.candidates) {
    choices *= static_cast<int64_t>(candidate.options.size());
    if (choices > (int64_t{1} << 20)) {
      throw std::invalid_argument(
          "ckpt::plan::solve_model_brute_force: more than 2^20 choices; it is the tests' "
          "oracle, for small profiles: use solve_model");
    }
  }
  ModelPlan plan;
  plan.exact = true;
  std::vector<int> choice(profile.candidates.size(), 0);
  for (int64_t n = 0; n < choices; ++n) {
    if (!detail::first_conflict(profile, choice)) {
      consider(profile, choice, budget_bytes, host_budget_bytes, plan);
    }
    // The next choice, as an odometer whose first candidate turns fastest.
    for (size_t c = 0; c < choice.size(); ++c) {
      if (++choice[c] < static_cast<int>(profile.candidates[c].options.size())) break;
      choice[c] = 0;
    }
  }
  return plan;
}

int64_t min_model_budget(const ModelProfile& profile, const ModelSolverOptions& options) {
  const ModelLimits limits = limits_of("min_model_budget", 0, options);
  return lowest_peak(ModelProblem(profile), limits).peak;
}

}  // namespace plan
}  // namespace ckpt
