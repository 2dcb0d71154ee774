// compare_bench: the side-by-side benchmark of ckpt against no checkpointing and Python's
// torch.utils.checkpoint (see bench/README.md).
//
//   compare_bench [--model mlp --model small ...] [--steps 15] [--warmup 3] [--threads 1]
//                 [--no-python] [--no-planned] [--quick] [--markdown bench/results.md]
//                 [--device cuda|emulated] [--offload-summary offload.md]

#include "harness.h"
#include "offload_summary.h"

#include <ckpt/emulated_device.h>

#include <CLI/CLI.hpp>

#include <fstream>
#include <iostream>
#include <string>

namespace {

bool write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  if (out) return true;
  std::cerr << "compare_bench: cannot write " << path << "\n";
  return false;
}

// --offload-summary: the offloading table and targets (scripts/gpu-check.sh), written and printed.
// Exit status 1 when a row it compares failed or is missing; a missed target is only reported.
int write_offload_summary(const std::vector<ckpt::bench::BenchRow>& rows,
                          const ckpt::bench::BenchOptions& options, const std::string& path) {
  const auto summary = ckpt::bench::offload_summary(rows, options);
  std::cout << summary.markdown;
  if (!write_file(path, summary.markdown)) return 1;
  for (const std::string& row : summary.missing) {
    std::cerr << "compare_bench: --offload-summary: no measurement of " << row << "\n";
  }
  return summary.missing.empty() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ckpt vs torch.utils.checkpoint: peak memory and step time per model and method"};
  ckpt::bench::BenchOptions options;
  bool no_python = false, no_planned = false, no_rss = false;
  std::string markdown, offload_path;
  app.add_option("--model", options.models, "mlp, resnet, transformer, small (default: all)")
      ->check(CLI::IsMember({"mlp", "resnet", "transformer", "small"}));
  app.add_option("--steps", options.steps, "timed steps per method (median)")
      ->capture_default_str();
  app.add_option("--warmup", options.warmup, "warm-up steps per method")->capture_default_str();
  app.add_option("--threads", options.threads, "intra-op threads (C++ and Python)")
      ->capture_default_str();
  app.add_flag("--no-python", no_python, "skip torch.utils.checkpoint");
  app.add_flag("--no-planned", no_planned, "skip PlannedSequential");
  app.add_flag("--no-rss", no_rss, "skip the RSS high-water-mark column");
  bool no_batch_norm = false;
  app.add_flag("--resnet-no-batchnorm", no_batch_norm,
               "ResNet-like chain without BatchNorm (conv -> ReLU)");
  app.add_flag("--quick", options.quick, "tiny models and few steps (a smoke test)");
  app.add_option("--python", options.python_executable, "Python interpreter with torch");
  app.add_option("--script", options.python_script, "path of torch_checkpoint.py");
  app.add_option("--markdown", markdown, "also write the tables to this file");
  app.add_option("--device", options.device,
                 "device of the methods: cpu, cuda, cuda:1, ..., or emulated[:N] (ckpt's emulated "
                 "accelerator, LibTorch 2.9+; Python runs on the CPU and CUDA only)")
      ->capture_default_str();
  app.add_option("--offload-summary", offload_path,
                 "also write the offloading comparison (no checkpointing, full recompute, ckpt's "
                 "and Python's offloading) with issue 31's targets to this file and print it; "
                 "needs an accelerator. Exit status 1 when one of its rows failed");
  CLI11_PARSE(app, argc, argv);
  options.python = !no_python;
  options.planned = !no_planned;
  options.rss = !no_rss;
  options.resnet_batch_norm = !no_batch_norm;
  const bool emulated = options.device.rfind("emulated", 0) == 0;
  if (emulated && !ckpt::emulated_device::has_accelerator_hooks()) {
    std::cerr << "compare_bench: --device " << options.device
              << ": the emulated device needs LibTorch 2.9 or later\n";
    return 2;
  }
  if (emulated) ckpt::emulated_device::install();  // before the first backward pass
  if (!offload_path.empty() && options.device.rfind("cuda", 0) != 0 && !emulated) {
    std::cerr << "compare_bench: --offload-summary: offloading needs an accelerator; use "
                 "--device cuda or --device emulated\n";
    return 2;
  }

  const auto rows = ckpt::bench::run_comparison(options);
  const std::string table = ckpt::bench::to_markdown(rows, options);
  std::cout << table;
  if (!markdown.empty() && !write_file(markdown, table)) return 1;
  return offload_path.empty() ? 0 : write_offload_summary(rows, options, offload_path);
}
