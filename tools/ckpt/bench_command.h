#pragma once

// `ckpt bench`: the side-by-side comparison of bench/compare (ckpt vs torch.utils.checkpoint).

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace ckpt {
namespace cli {

struct BenchArgs {
  std::string device_profile_path;  // --device-profile: measure --device, write it, and stop
  std::vector<std::string> models;
  int steps = 15;
  int warmup = 3;
  int threads = 1;
  bool quick = false;
  bool no_python = false;
  bool no_planned = false;
  bool no_rss = false;               // --no-rss: no RSS high-water marks
  bool resnet_no_batchnorm = false;  // --resnet-no-batchnorm: the ResNet without BatchNorm layers
  std::string python;
  std::string script;  // --script: torch_checkpoint.py (empty: the installed or source tree's)
  std::string device = "cpu";
  std::string storage_modes =
      "checkpointed,two_pass,selective";  // --storage-modes of the planned rows
  std::string markdown_path;
  std::string json_path;
  std::string plot_path;
  std::string offload_summary_path;  // --offload-summary: the offloading comparison (accelerators)
};

/// Adds the `bench` subcommand, whose options fill `args`.
CLI::App* add_bench_command(CLI::App& app, BenchArgs& args);

/// Runs `ckpt bench`. Returns the exit code.
int run_bench(const BenchArgs& args);

}  // namespace cli
}  // namespace ckpt
