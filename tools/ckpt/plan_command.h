#pragma once

// `ckpt plan`: solve a chain file under a memory budget and print the schedule.

#include <ckpt/plan/chain.h>
#include <ckpt/plan/schedule.h>
#include <ckpt/plan/simulator.h>

#include <CLI/CLI.hpp>

#include <optional>
#include <ostream>
#include <string>

namespace ckpt {
namespace cli {

struct PlanArgs {
  std::string chain_path;
  std::string budget;
  std::string solver = "optimal";
  int slots = 500;
  bool json = false;
};

/// What one solver gives for a chain and a budget.
struct PlanOutcome {
  /// A schedule exists and its simulated peak fits the budget.
  bool feasible = false;
  /// The solver's schedule; empty when the optimal solver finds none (budget too small). Fixed
  /// solvers (none, uniform:K, sqrt, revolve:S) always give one, feasible or not.
  std::optional<plan::Schedule> schedule;
  plan::SimulationResult prediction;
  /// The solver as run, e.g. "uniform:4" for "uniform" (which picks the best K).
  std::string solver;
  /// Why it is infeasible, empty otherwise.
  std::string message;
};

/// Runs solver `solver` ("optimal", "uniform", "uniform:K", "sqrt", "revolve", "revolve:S",
/// "none") on `chain` under `budget_bytes`. Throws UsageError for an unknown solver or a K/S
/// out of range.
PlanOutcome solve_with(const plan::Chain& chain, int64_t budget_bytes, const std::string& solver,
                       int slots);

/// Adds the `plan` subcommand, whose options fill `args`.
CLI::App* add_plan_command(CLI::App& app, PlanArgs& args);

/// Runs `ckpt plan`; prints to `out`. Returns the exit code.
int run_plan(const PlanArgs& args, std::ostream& out);

}  // namespace cli
}  // namespace ckpt
