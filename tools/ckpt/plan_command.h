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
  // --model: a bench model planned without the device (docs/cli.md, "Planning without the device")
  std::string model;
  bool quick = false;
  std::string device_profile_path;
  std::string device_memory;
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
/// A bench model's chain as measured on the meta device under a device profile, and the bytes
/// that live through its step besides (parameters, input).
struct ModeledChain {
  plan::Chain chain;
  int64_t resident_bytes = 0;
  int64_t device_memory_bytes = 0;  // of the profile, or --device-memory
  std::string device_name;
};
using ModelChainSource = ModeledChain (*)(const PlanArgs& args);

/// Runs `ckpt plan`; `--model` needs `model_chain` (the program's LibTorch part supplies it).
int run_plan(const PlanArgs& args, std::ostream& out, ModelChainSource model_chain = nullptr);

}  // namespace cli
}  // namespace ckpt
