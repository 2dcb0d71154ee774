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
                      int slots, int64_t host_budget_bytes) {
  if (slots < 1)
    throw UsageError("--slots must be a positive integer, but got " + std::to_string(slots));
  plan::OptimalOptions options;
  options.slots = slots;
  options.host_budget_bytes = host_budget_bytes;
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
  CLI::Option* chain =
      command->add_option("--chain", args.chain_path, "Chain description (JSON, see docs/cli.md)")
          ->type_name("FILE.json");
  CLI::Option* model =
      command
          ->add_option("--model", args.model,
                       "A bench model (mlp, resnet, transformer, small) measured "
                       "without the device: on the meta device, under --device-profile")
          ->type_name("NAME")
          ->excludes(chain);
  chain->excludes(model);
  command->add_flag("--quick", args.quick, "With --model: the bench's small sizes");
  command
      ->add_option("--device-profile", args.device_profile_path,
                   "With --model: the device to plan for (JSON, written by `ckpt bench "
                   "--device-profile FILE` on it, or by hand)")
      ->type_name("FILE.json")
      ->needs(model);
  command
      ->add_option("--device-memory", args.device_memory,
                   "With --model: the device's memory (80GiB), instead of the profile's")
      ->type_name("BYTES")
      ->needs(model);
  command
      ->add_option("--budget", args.budget,
                   "Memory budget: bytes (1048576, 512MiB, 2GB, ...), a percentage of the "
                   "chain's no-checkpoint peak (40%), or min (the smallest feasible budget). "
                   "With --model, by default the device's memory less the parameters and input")
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
  command
      ->add_option("--host-budget", args.host_budget,
                   "Host memory for offloaded activations: bytes as for --budget, or 0 "
                   "(default: unlimited)")
      ->type_name("BYTES");
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

int64_t parse_host_budget(const std::string& text) {
  if (text.empty()) return std::numeric_limits<int64_t>::max();
  if (text == "0") return 0;
  try {
    return plan::parse_bytes(text, "the host budget");
  } catch (const std::invalid_argument& error) {
    throw UsageError(std::string("--host-budget: ") + error.what() + " (or 0 for none)");
  }
}

namespace {

// What `ckpt plan` found, for its two writers.
struct PlanReport {
  plan::Chain chain;
  plan::SimulationResult baseline;  // storing everything
  int64_t min_budget = 0;
  int64_t budget_bytes = 0;
  int64_t host_budget_bytes = std::numeric_limits<int64_t>::max();
  plan::Plan outcome;
  std::string message;  // why it is infeasible, with the smallest feasible budget
};

// The largest n in [1, high] with fits(n), for fits true up to some n and false beyond.
template <class Fits>
int64_t largest_fitting(int64_t high, const Fits& fits) {
  int64_t low = 1;
  while (low < high) {
    const int64_t middle = low + (high - low + 1) / 2;
    if (fits(middle)) {
      low = middle;
    } else {
      high = middle - 1;
    }
  }
  return low;
}

// Refuses up front what the optimal solver would refuse after reading the chain, with advice that
// works: fewer --slots where the slot table is what is too large, fewer stages where the
// programs on every stage are (their size does not depend on the slots).
void check_table_limit(const PlanArgs& args, const plan::Chain& chain, int64_t host_budget_bytes) {
  plan::OptimalOptions options;
  options.slots = args.slots;
  options.host_budget_bytes = host_budget_bytes;
  const int64_t table_bytes = plan::optimal_table_bytes(chain, options);
  if (args.solver != "optimal" || table_bytes <= options.max_table_bytes) return;
  // The advice varies the stages: count the host axis only where this chain has one.
  if (host_budget_bytes >= chain.max_host_bytes()) {
    options.host_budget_bytes = std::numeric_limits<int64_t>::max();
  }
  const auto fits = [&](int stages, int slots) {
    plan::OptimalOptions tried = options;
    tried.slots = slots;
    return plan::optimal_table_bytes(stages, tried) <= tried.max_table_bytes;
  };
  const std::string needs = "the optimal solver needs " + format_bytes(table_bytes) +
                            " of tables for " + std::to_string(chain.size()) +
                            " stages, above its limit of " + format_bytes(options.max_table_bytes);
  if (fits(chain.size(), 1)) {
    const int64_t slots = largest_fitting(
        args.slots, [&](int64_t n) { return fits(chain.size(), static_cast<int>(n)); });
    throw UsageError("--slots " + std::to_string(args.slots) + ": " + needs + "; use at most " +
                     std::to_string(slots) + " --slots");
  }
  const int64_t stages = largest_fitting(
      chain.size(), [&](int64_t n) { return fits(static_cast<int>(n), args.slots); });
  throw UsageError("--chain " + args.chain_path + ": " + needs +
                   "; merge consecutive stages into at most " + std::to_string(stages) +
                   " (a merged stage's times and sizes add up)");
}

void write_json(const PlanReport& r, std::ostream& out) {
  const bool has_schedule = r.outcome.schedule.has_value();
  const auto& prediction = r.outcome.prediction;
  json result;
  result["feasible"] = r.outcome.feasible;
  result["solver"] = r.outcome.solver;
  result["budget_bytes"] = r.budget_bytes;
  result["stages"] = r.chain.size();
  result["predicted_time"] = has_schedule ? json(prediction.time) : json(nullptr);
  result["predicted_peak_bytes"] = has_schedule ? json(prediction.peak_bytes) : json(nullptr);
  result["predicted_host_peak_bytes"] =
      has_schedule ? json(prediction.host_peak_bytes) : json(nullptr);
  result["host_budget_bytes"] = r.host_budget_bytes == std::numeric_limits<int64_t>::max()
                                    ? json(nullptr)
                                    : json(r.host_budget_bytes);
  result["forward_count"] = has_schedule ? json(prediction.forward_count) : json(nullptr);
  result["schedule"] =
      has_schedule ? schedule_to_json(*r.outcome.schedule, r.chain) : json::array();
  result["look_ahead"] = has_schedule ? json(r.outcome.schedule->look_ahead) : json::array();
  result["schedule_text"] = has_schedule ? plan::to_string(*r.outcome.schedule) : "";
  result["min_feasible_budget_bytes"] = r.min_budget;
  result["no_checkpoint_time"] = r.baseline.time;
  result["no_checkpoint_peak_bytes"] = r.baseline.peak_bytes;
  if (has_schedule && r.baseline.time > 0) {
    result["overhead"] = prediction.time / r.baseline.time - 1.0;
  }
  if (!r.outcome.feasible) result["message"] = r.message;
  out << result.dump(2) << "\n";
}

std::string percent_of(double part, double whole, const char* format) {
  char text[64];
  std::snprintf(text, sizeof text, format, whole > 0 ? 100.0 * part / whole : 0.0);
  return text;
}

void write_text(const PlanReport& r, const PlanArgs& args, std::ostream& out) {
  out << "chain:      "
      << (args.model.empty() ? args.chain_path : "model " + args.model + " (modeled)") << " ("
      << r.chain.size() << " stages, input " << format_bytes(r.chain.input_bytes) << ")\n";
  const std::string detail =
      r.outcome.solver == "optimal"
          ? " (exact in bytes where it finishes in time, else " + std::to_string(args.slots) +
                " slots: see docs/memory-model.md, \"What solve_optimal runs\")"
          : "";
  out << "solver:     " << r.outcome.solver << detail << "\n";
  out << "budget:     " << format_bytes(r.budget_bytes) << " (" << r.budget_bytes << " bytes)\n";
  out << "feasible:   " << (r.outcome.feasible ? "yes" : "no") << "\n";
  if (r.outcome.schedule) {
    const auto& prediction = r.outcome.prediction;
    out << "schedule:   " << plan::to_string(*r.outcome.schedule) << "\n";
    out << "forwards:   " << prediction.forward_count << " (" << r.chain.size() << " stages, "
        << prediction.forward_count - r.chain.size() << " recomputed)\n";
    out << "time:       " << format_seconds(prediction.time) << " per step (no checkpointing "
        << format_seconds(r.baseline.time) << ", overhead "
        << percent_of(prediction.time - r.baseline.time, r.baseline.time, "%+.1f%%") << ")\n";
    out << "peak:       " << format_bytes(prediction.peak_bytes) << " (" << prediction.peak_bytes
        << " bytes; no checkpointing " << format_bytes(r.baseline.peak_bytes) << ", "
        << percent_of(static_cast<double>(prediction.peak_bytes),
                      static_cast<double>(r.baseline.peak_bytes), "%.1f%%")
        << ")\n";
    if (r.chain.max_host_bytes() > 0) {
      out << "host peak:  " << format_bytes(prediction.host_peak_bytes) << " ("
          << prediction.host_peak_bytes << " bytes of offloaded activations in host memory)\n";
    }
  }
  out << "min budget: " << format_bytes(r.min_budget) << " (" << r.min_budget
      << " bytes, the smallest budget any persistent schedule fits"
      << (args.host_budget.empty() ? "" : " within the host budget") << ")\n";
  if (!r.outcome.feasible) out << "note:       infeasible: " << r.message << "\n";
}

}  // namespace

namespace {

// --model's chain, and the budget the device leaves where --budget is not given.
plan::Chain modeled_chain(const PlanArgs& args, ModelChainSource source,
                          std::string& default_budget) {
  if (args.device_profile_path.empty()) {
    throw UsageError("--model " + args.model +
                     " needs --device-profile FILE: the device to plan for (write one with "
                     "`ckpt bench --device-profile FILE` on that device)");
  }
  if (source == nullptr) throw UsageError("--model: this program can't measure models");
  const ModeledChain modeled = source(args);
  if (args.budget.empty()) {
    if (modeled.device_memory_bytes <= 0) {
      throw UsageError("--model: the profile of " + modeled.device_name +
                       " gives no memory; pass --device-memory (80GiB) or --budget");
    }
    const int64_t left = modeled.device_memory_bytes - modeled.resident_bytes;
    if (left <= 0) {
      throw UsageError("--model: the parameters and input (" +
                       format_bytes(modeled.resident_bytes) + ") don't fit in the device's " +
                       format_bytes(modeled.device_memory_bytes));
    }
    default_budget = std::to_string(left);
  }
  return modeled.chain;
}

}  // namespace

int run_plan(const PlanArgs& args, std::ostream& out, ModelChainSource model_chain) {
  if (args.slots < 1) {
    throw UsageError("--slots must be a positive integer, but got " + std::to_string(args.slots));
  }
  if (args.chain_path.empty() && args.model.empty()) {
    throw UsageError("plan needs --chain FILE.json or --model NAME");
  }
  if (!args.chain_path.empty() && args.budget.empty()) throw UsageError("--chain needs --budget");
  PlanReport report;
  report.host_budget_bytes = parse_host_budget(args.host_budget);
  std::string budget = args.budget;
  report.chain = args.model.empty() ? load_chain_file(args.chain_path)
                                    : modeled_chain(args, model_chain, budget);
  check_table_limit(args, report.chain, report.host_budget_bytes);
  report.baseline = plan::simulate(report.chain, plan::solve_no_checkpoint(report.chain));
  plan::OptimalOptions host;
  host.host_budget_bytes = report.host_budget_bytes;
  report.min_budget = plan::min_feasible_budget_bytes(report.chain, host);
  report.budget_bytes = parse_budget(budget, report.baseline.peak_bytes, report.min_budget);
  report.outcome = solve_with(report.chain, report.budget_bytes, args.solver, args.slots,
                              report.host_budget_bytes);
  report.message = report.outcome.message;
  if (!report.outcome.feasible) {
    report.message += "; the smallest feasible budget for this chain" +
                      std::string(args.host_budget.empty() ? "" : " within the host budget") +
                      " is " + std::to_string(report.min_budget) + " bytes (" +
                      format_bytes(report.min_budget) + ")";
  }
  if (args.json) {
    write_json(report, out);
  } else {
    write_text(report, args, out);
  }
  return kExitOk;
}

}  // namespace cli
}  // namespace ckpt
