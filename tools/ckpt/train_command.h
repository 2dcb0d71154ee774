#pragma once

// `ckpt train`: train the built-in GPT twice (no checkpointing, then a strategy) and compare.

#include "train_args.h"

#include <CLI/CLI.hpp>

namespace ckpt {
namespace cli {

/// Adds the `train` subcommand, whose options fill `args`.
CLI::App* add_train_command(CLI::App& app, TrainArgs& args);

/// Runs `ckpt train`. Returns the exit code (130 when interrupted by Ctrl-C).
int run_train(const TrainArgs& args);

}  // namespace cli
}  // namespace ckpt
