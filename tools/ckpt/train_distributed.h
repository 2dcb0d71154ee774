#pragma once

// `ckpt train --ranks N` and `ckpt train --rank R --world-size N ...`: data-parallel training of
// the built-in GPT over c10d (ckpt::distributed), compared with one process on the whole batch.

#include "train_args.h"

#include <CLI/CLI.hpp>

namespace ckpt {
namespace cli {

/// Adds --ranks, --rank, --world-size, --master-addr and --master-port to `train`.
void add_distributed_options(CLI::App* train, TrainArgs& args);

/// Whether `args` (or the torchrun environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)
/// ask for data-parallel training.
bool wants_distributed(const TrainArgs& args);

/// Runs the data-parallel training: N local processes (--ranks), or this process as one rank of
/// an outside group. Rank 0 prints the summary and writes --json. Returns the exit code.
int run_train_distributed(const TrainArgs& args);

}  // namespace cli
}  // namespace ckpt
