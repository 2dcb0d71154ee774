#pragma once

// `ckpt plan`: solve a chain file under a memory budget and print the schedule.

#include <ckpt/plan/chain.h>
#include <ckpt/plan/schedule.h>
#include <ckpt/plan/simulator.h>
#include <ckpt/plan/spec.h>

#include <CLI/CLI.hpp>

#include <cstdint>
#include <limits>
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
  std::string host_budget;  // empty: unlimited
  bool json = false;
};

/// Runs solver `solver` ("optimal", "uniform", "uniform:K", "sqrt", "revolve", "revolve:S",
/// "none") on `chain` under `budget_bytes` and `host_budget_bytes` of host memory for offloaded
/// activations. Throws UsageError for an unknown solver or a K/S out of range.
plan::Plan solve_with(const plan::Chain& chain, int64_t budget_bytes, const std::string& solver,
                      int slots, int64_t host_budget_bytes = std::numeric_limits<int64_t>::max());

/// `--host-budget`: bytes as `--budget` writes them (parse_bytes), or 0 (no host memory: nothing
/// is offloaded); unlimited when empty. Throws UsageError otherwise.
int64_t parse_host_budget(const std::string& text);

/// Adds the `plan` subcommand, whose options fill `args`.
CLI::App* add_plan_command(CLI::App& app, PlanArgs& args);

/// Runs `ckpt plan`; prints to `out`. Returns the exit code.
int run_plan(const PlanArgs& args, std::ostream& out);

}  // namespace cli
}  // namespace ckpt
