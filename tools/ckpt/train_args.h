#pragma once

// The options of `ckpt train` and their checks, which run before any work starts: sizes in range
// (with an estimate of the memory they need), writable output paths.

#include <cstdint>
#include <string>

namespace ckpt {
namespace cli {

struct TrainArgs {
  std::string model = "gpt";  // --model: "gpt", or "unet" (train_unet.h)
  int64_t layers = 8;
  int64_t width = 128;
  int64_t heads = 4;
  int64_t context = 128;
  int64_t batch = 8;
  int64_t steps = 60;
  int64_t threads = 1;
  std::string strategy = "budget:35%";
  std::string storage_modes =
      "checkpointed,two_pass,selective";  // --storage-modes (budget strategies)
  uint64_t seed = 1234;
  double lr = 6e-4;  // GPT-2's and nanoGPT's, with the same betas and weight decay
  double dropout = 0.1;
  bool untied = false;
  std::string corpus;
  std::string plot_path;
  std::string trace_path;
  std::string json_path;
  std::string chain_path;  // where to write the measured chain (the planner's input)
  bool report = false;     // --report: what the checkpointed run's regions keep (first step)
  // Data-parallel training (train_distributed.h): local ranks, or one rank of an outside group.
  int64_t ranks = 0;
  int64_t rank = -1;
  int64_t world_size = 0;
  bool ranks_given = false;  // the three above were on the command line
  bool rank_given = false;
  bool world_size_given = false;
  std::string master_addr = "127.0.0.1";
  int64_t master_port = 29500;
  int64_t timeout_seconds = 60;  // how long the ranks wait for each other
  bool dropout_given = false;    // a data-parallel run defaults to no dropout
  std::string dtype = "float32";
  // Where the model trains: "cpu", or an accelerator as run_train normalises it ("cuda:0",
  // "emulated:1"); see models/device_option.h.
  std::string device = "cpu";
};

/// What the machine offers; the checks compare the options against it.
struct MachineLimits {
  double memory_bytes = 0;  // physical memory
  int64_t cores = 1;        // hardware threads
  static MachineLimits of_this_machine();
};

/// Throws UsageError when `threads` (the value of `option`) is not in [1, the machine's hardware
/// threads]: more only slow a step down, and LibTorch's thread pool fails on absurd counts.
void validate_threads(int64_t threads, const MachineLimits& machine, const std::string& option);

/// A lower bound of the bytes one step without checkpointing needs (weights, gradients, AdamW
/// state and the attention and MLP activations autograd keeps), in floating point so that no size
/// overflows.
double min_training_bytes(const TrainArgs& args);

/// Throws UsageError naming the option when a size is out of range, the sizes would need more
/// memory than the machine has (with the estimate), or an output path cannot be written.
void validate_train_args(const TrainArgs& args, const MachineLimits& machine);

}  // namespace cli
}  // namespace ckpt
