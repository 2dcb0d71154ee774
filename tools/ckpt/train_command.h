#pragma once

// `ckpt train`: train the built-in GPT twice (no checkpointing, then a strategy) and compare.

#include <CLI/CLI.hpp>

#include <string>

namespace ckpt {
namespace cli {

struct TrainArgs {
  int64_t layers = 8;
  int64_t width = 128;
  int64_t heads = 4;
  int64_t context = 128;
  int64_t batch = 8;
  int64_t steps = 60;
  int64_t threads = 1;
  std::string strategy = "budget:35%";
  uint64_t seed = 1234;
  double lr = 3e-3;
  double dropout = 0.1;
  bool untied = false;
  bool no_baseline = false;
  std::string corpus;
  std::string plot_path;
  std::string trace_path;
  std::string json_path;
  std::string chain_path;  // where to write the measured chain (the planner's input)
};

/// Adds the `train` subcommand, whose options fill `args`.
CLI::App* add_train_command(CLI::App& app, TrainArgs& args);

/// Runs `ckpt train`. Returns the exit code (130 when interrupted by Ctrl-C).
int run_train(const TrainArgs& args);

}  // namespace cli
}  // namespace ckpt
