// compare_bench: the side-by-side benchmark of ckpt against no checkpointing and Python's
// torch.utils.checkpoint (see bench/README.md).
//
//   compare_bench [--model mlp --model small ...] [--steps 15] [--warmup 3] [--threads 1]
//                 [--no-python] [--no-planned] [--quick] [--markdown bench/results.md]

#include "harness.h"

#include <CLI/CLI.hpp>

#include <fstream>
#include <iostream>

int main(int argc, char** argv) {
  CLI::App app{"ckpt vs torch.utils.checkpoint: peak memory and step time per model and method"};
  ckpt::bench::BenchOptions options;
  bool no_python = false, no_planned = false, no_rss = false;
  std::string markdown;
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
                 "device of the C++ methods: cpu, cuda, cuda:1, ... (Python runs on the CPU only)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  options.python = !no_python;
  options.planned = !no_planned;
  options.rss = !no_rss;
  options.resnet_batch_norm = !no_batch_norm;

  const auto rows = ckpt::bench::run_comparison(options);
  const std::string table = ckpt::bench::to_markdown(rows, options);
  std::cout << table;
  if (!markdown.empty()) {
    std::ofstream out(markdown);
    if (!out) {
      std::cerr << "compare_bench: cannot write " << markdown << "\n";
      return 1;
    }
    out << table;
  }
  return 0;
}
