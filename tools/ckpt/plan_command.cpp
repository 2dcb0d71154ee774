#include "plan_command.h"

#include "chain_json.h"
#include "errors.h"
#include "units.h"

#include <ckpt/plan/solvers.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <limits>
#include <sstream>

namespace ckpt {
namespace cli {
using nlohmann::json;

plan::Plan solve_with(const plan::Chain& chain, int64_t budget_bytes, const std::string& solver,
                      int slots) {
  if (slots < 1)
    throw UsageError("--slots must be a positive integer, but got " + std::to_string(slots));
  plan::OptimalOptions options;
  options.slots = slots;
  try {
    return plan::solve(chain, plan::SolverSpec::parse(solver), budget_bytes, options);
  } catch (const std::invalid_argument& error) {
    throw UsageError(std::string("--solver: ") + error.what());
  }
}

CLI::App* add_plan_command(CLI::App& app, PlanArgs& args) {
  CLI::App* command = app.add_subcommand(
      "plan", "Find the fastest checkpointing schedule of a chain (a JSON file) under a budget");
  command->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  command->add_option("--chain", args.chain_path, "Chain description (JSON, see docs/cli.md)")
      ->required()
      ->type_name("FILE.json");
  command
      ->add_option("--budget", args.budget,
                   "Memory budget: bytes (1048576, 512MiB, 2GB, ...), a percentage of the "
                   "chain's no-checkpoint peak (40%), or min (the smallest feasible budget)")
      ->required()
      ->type_name("BYTES");
  command
      ->add_option("--solver", args.solver,
                   "optimal | uniform[:K] | sqrt | revolve[:S] | none (uniform and revolve "
                   "without a number pick the fastest that fits)")
      ->type_name("NAME")
      ->capture_default_str();
  command->add_option("--slots", args.slots, "Memory slots of the optimal solver")
      ->type_name("N")
      ->capture_default_str();
  command->add_flag("--json", args.json, "Print one JSON object instead of text");
  return command;
}

// Bytes ("64MiB"), a percentage of the chain's no-checkpoint peak ("40%") or "min".
int64_t parse_budget(const std::string& text, int64_t no_checkpoint_peak_bytes,
                     int64_t min_feasible_bytes) {
  try {
    return plan::Budget::parse(text).resolve(no_checkpoint_peak_bytes, min_feasible_bytes);
  } catch (const std::invalid_argument& error) {
    throw UsageError(std::string("--budget: ") + error.what());
  }
}

int run_plan(const PlanArgs& args, std::ostream& out) {
  if (args.slots < 1) {
    throw UsageError("--slots must be a positive integer, but got " + std::to_string(args.slots));
  }
  const plan::Chain chain = load_chain_file(args.chain_path);
  plan::OptimalOptions optimal_options;
  optimal_options.slots = args.slots;
  const int64_t table_bytes = plan::optimal_table_bytes(chain.size(), optimal_options);
  if (args.solver == "optimal" && table_bytes > plan::OptimalOptions{}.max_table_bytes) {
    throw UsageError("--slots " + std::to_string(args.slots) + ": the optimal solver needs " +
                     format_bytes(table_bytes) + " of tables for " + std::to_string(chain.size()) +
                     " stages, above its limit of " +
                     format_bytes(plan::OptimalOptions{}.max_table_bytes) + "; use fewer --slots");
  }
  const plan::SimulationResult baseline = plan::simulate(chain, plan::solve_no_checkpoint(chain));
  const int64_t min_budget = plan::min_feasible_budget_bytes(chain);
  const int64_t budget_bytes = parse_budget(args.budget, baseline.peak_bytes, min_budget);
  const plan::Plan outcome = solve_with(chain, budget_bytes, args.solver, args.slots);
  const bool has_schedule = outcome.schedule.has_value();
  std::string message = outcome.message;
  if (!outcome.feasible) {
    message += "; the smallest feasible budget for this chain is " + std::to_string(min_budget) +
               " bytes (" + format_bytes(min_budget) + ")";
  }

  if (args.json) {
    json result;
    result["feasible"] = outcome.feasible;
    result["solver"] = outcome.solver;
    result["budget_bytes"] = budget_bytes;
    result["stages"] = chain.size();
    if (has_schedule) {
      result["predicted_time"] = outcome.prediction.time;
      result["predicted_peak_bytes"] = outcome.prediction.peak_bytes;
      result["forward_count"] = outcome.prediction.forward_count;
      result["schedule"] = schedule_to_json(*outcome.schedule);
      result["schedule_text"] = plan::to_string(*outcome.schedule);
    } else {
      result["predicted_time"] = nullptr;
      result["predicted_peak_bytes"] = nullptr;
      result["forward_count"] = nullptr;
      result["schedule"] = json::array();
      result["schedule_text"] = "";
    }
    result["min_feasible_budget_bytes"] = min_budget;
    result["no_checkpoint_time"] = baseline.time;
    result["no_checkpoint_peak_bytes"] = baseline.peak_bytes;
    if (has_schedule && baseline.time > 0) {
      result["overhead"] = outcome.prediction.time / baseline.time - 1.0;
    }
    if (!outcome.feasible) result["message"] = message;
    out << result.dump(2) << "\n";
    return kExitOk;
  }

  char line[256];
  out << "chain:      " << args.chain_path << " (" << chain.size() << " stages, input "
      << format_bytes(chain.input_bytes) << ")\n";
  std::string detail;
  if (outcome.solver == "optimal") {
    detail = " (" + std::to_string(args.slots) + " slots";
    if (chain.size() > optimal_options.max_exact_stages) {
      detail += ", stages in " + std::to_string(optimal_options.groups) +
                " groups: see docs/memory-model.md, \"Long chains\"";
    }
    detail += ")";
  }
  out << "solver:     " << outcome.solver << detail << "\n";
  out << "budget:     " << format_bytes(budget_bytes) << " (" << budget_bytes << " bytes)\n";
  out << "feasible:   " << (outcome.feasible ? "yes" : "no") << "\n";
  if (has_schedule) {
    const auto& prediction = outcome.prediction;
    out << "schedule:   " << plan::to_string(*outcome.schedule) << "\n";
    out << "forwards:   " << prediction.forward_count << " (" << chain.size() << " stages, "
        << prediction.forward_count - chain.size() << " recomputed)\n";
    std::snprintf(line, sizeof line, "%+.1f%%",
                  baseline.time > 0 ? 100.0 * (prediction.time / baseline.time - 1) : 0.0);
    out << "time:       " << format_seconds(prediction.time) << " per step (no checkpointing "
        << format_seconds(baseline.time) << ", overhead " << line << ")\n";
    std::snprintf(line, sizeof line, "%.1f%%",
                  100.0 * static_cast<double>(prediction.peak_bytes) /
                      static_cast<double>(baseline.peak_bytes));
    out << "peak:       " << format_bytes(prediction.peak_bytes) << " (" << prediction.peak_bytes
        << " bytes; no checkpointing " << format_bytes(baseline.peak_bytes) << ", " << line
        << ")\n";
  }
  out << "min budget: " << format_bytes(min_budget) << " (" << min_budget
      << " bytes, the smallest budget any persistent schedule fits)\n";
  if (!outcome.feasible) out << "note:       infeasible: " << message << "\n";
  return kExitOk;
}

}  // namespace cli
}  // namespace ckpt
