#include "bench_command.h"

#include "device_option.h"
#include "errors.h"
#include "output_path.h"
#include "strategy.h"
#include "svg_chart.h"
#include "train_args.h"
#include "units.h"

#include <ckpt/modeled_device.h>

#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <stdexcept>
#include <system_error>

#ifdef CKPT_CLI_HAVE_BENCH
#include "compare/harness.h"
#include "compare/offload_summary.h"
#endif

namespace ckpt {
namespace cli {

CLI::App* add_bench_command(CLI::App& app, BenchArgs& args) {
  CLI::App* command = app.add_subcommand(
      "bench",
      "Compare no checkpointing, ckpt's checkpoint_sequential and planned schedules, and Python's "
      "torch.utils.checkpoint on the same models");
  command
      ->add_option("--models", args.models,
                   "Models to run, comma-separated: mlp, resnet, transformer, small (default: all)")
      ->delimiter(',')
      ->type_name("LIST");
  command->add_option("--steps", args.steps, "Timed steps per method")->capture_default_str();
  command->add_option("--warmup", args.warmup, "Untimed steps before timing")
      ->capture_default_str();
  command->add_option("--threads", args.threads, "Intra-op threads")->capture_default_str();
  command->add_flag("--quick", args.quick, "Small sizes and few steps (a smoke test)");
  command
      ->add_option("--device", args.device,
                   std::string("Device of the C++ methods: ") + models::kDeviceChoices +
                       " (emulated: ckpt's emulated accelerator, LibTorch 2.9+; Python runs on "
                       "the CPU and CUDA only)")
      ->type_name("DEVICE")
      ->capture_default_str();
  command
      ->add_option("--device-profile", args.device_profile_path,
                   "Measure --device for planning without it (`ckpt plan --model ... "
                   "--device-profile FILE`), write its profile to FILE and stop")
      ->type_name("FILE.json");
  command->add_flag("--no-python", args.no_python, "Skip torch.utils.checkpoint");
  command->add_flag("--no-planned", args.no_planned, "Skip ckpt's planned schedules");
  command->add_flag("--no-rss", args.no_rss,
                    "Skip the RSS high-water-mark column (each step's VmHWM, Linux)");
  command->add_flag("--resnet-no-batchnorm", args.resnet_no_batchnorm,
                    "Build the ResNet without BatchNorm layers (conv -> ReLU)");
  command->add_option("--storage-modes", args.storage_modes, models::storage_modes_help())
      ->type_name("LIST")
      ->capture_default_str();
  command
      ->add_option("--python", args.python,
                   "Python interpreter with torch (default: the one ckpt was built with, else "
                   "/usr/bin/python3)")
      ->type_name("PATH");
  command
      ->add_option("--script", args.script,
                   "The Python side, torch_checkpoint.py (default: the one installed with ckpt, "
                   "share/ckpt, else bench/compare/ of the source tree)")
      ->type_name("FILE");
  command->add_option("--markdown", args.markdown_path, "Also write the markdown tables to FILE")
      ->type_name("FILE");
  command->add_option("--json", args.json_path, "Write every row as JSON to FILE")
      ->type_name("FILE");
  command
      ->add_option("--plot", args.plot_path,
                   "Draw step time against peak memory per model as an SVG chart in FILE: "
                   "checkpoint_sequential at every segment count, planned budgets, and the "
                   "predicted optimum")
      ->type_name("FILE.svg");
  command
      ->add_option("--offload-summary", args.offload_summary_path,
                   "Also write the offloading comparison to FILE and print it: no checkpointing, "
                   "full recompute, ckpt's offload with and without its look-ahead and Python's "
                   "save_on_cpu, with issue 50's targets beside the measures; needs --device cuda "
                   "or emulated. Exit code 1 "
                   "when one of its rows could not be measured")
      ->type_name("FILE");
  return command;
}

#ifdef CKPT_CLI_HAVE_BENCH
namespace {

bench::BenchOptions bench_options(const BenchArgs& args) {
  bench::BenchOptions options;
  options.models = args.models;
  options.steps = args.steps;
  options.warmup = args.warmup;
  options.threads = args.threads;
  options.quick = args.quick;
  options.device = args.device;
  options.python = !args.no_python;
  options.planned = !args.no_planned;
  options.rss = !args.no_rss;
  options.resnet_batch_norm = !args.resnet_no_batchnorm;
  options.storage_modes = args.storage_modes;
  options.python_executable = args.python;
  options.python_script = args.script;
  options.every_segment_count = !args.plot_path.empty();
  return options;
}

void write_json(const std::vector<bench::BenchRow>& rows, const BenchArgs& args) {
  nlohmann::json list = nlohmann::json::array();
  for (const bench::BenchRow& row : rows) {
    list.push_back({{"model", row.model},
                    {"method", row.method},
                    {"segments", row.segments},
                    {"setting", row.setting},
                    {"budget_bytes", row.budget_bytes},
                    {"peak_bytes", row.peak_bytes},
                    {"predicted_peak_bytes", row.predicted_peak_bytes},
                    {"step_ms", row.step_ms},
                    {"predicted_step_ms", row.predicted_step_ms},
                    {"overhead", row.overhead},
                    {"predicted_overhead", row.predicted_overhead},
                    {"memory_ratio", row.memory_ratio},
                    {"rss_memory_ratio", row.rss_memory_ratio},
                    {"forward_count", row.forward_count},
                    {"solver_ms", row.solver_ms},
                    {"planning_ms", row.planning_ms}});
  }
  const std::string document =
      nlohmann::json{
          {"rows", list}, {"steps", args.steps}, {"threads", args.threads}, {"quick", args.quick}}
          .dump(2) +
      "\n";
  write_whole_file(args.json_path, document, "--json");
}

// One series of a model's chart: (peak as % of no checkpointing, step time over it), by peak.
ChartSeries curve(const std::vector<bench::BenchRow>& rows, const std::string& model,
                  const std::string& method, bool predicted, ChartSeries style) {
  for (const bench::BenchRow& row : rows) {
    if (row.model != model || row.method != method) continue;
    if (predicted && row.predicted_overhead > 0 && row.memory_ratio > 0) {
      style.points.emplace_back(100 * row.memory_ratio, row.predicted_overhead);
    } else if (!predicted && row.step_ms > 0 && row.memory_ratio > 0) {
      style.points.emplace_back(100 * row.memory_ratio, row.overhead);
    }
  }
  std::sort(style.points.begin(), style.points.end());
  return style;
}

std::vector<Chart> bench_charts(const std::vector<bench::BenchRow>& rows) {
  std::vector<Chart> charts;
  for (const bench::BenchRow& row : rows) {
    if (row.method != "none") continue;
    Chart chart;
    chart.title = row.model + ": step time against peak memory";
    chart.x_label = "peak memory (% of no checkpointing)";
    chart.y_label = "step time (x no checkpointing)";
    chart.y_min = 1.0;
    chart.series = {
        curve(rows, row.model, "ckpt_sequential", false,
              {"checkpoint_sequential, every segment count", "#1f77b4", {}, true, false, false}),
        curve(rows, row.model, "ckpt_planned", false,
              {"PlannedSequential, measured", "#d62728", {}, true, false, false}),
        curve(rows, row.model, "ckpt_model_planned", false,
              {"PlannedModel, measured", "#9467bd", {}, true, false, false}),
        curve(rows, row.model, "predicted_optimum", true,
              {"optimum, predicted from the profile", "#2ca02c", {}, false, true}),
    };
    charts.push_back(std::move(chart));
  }
  return charts;
}

// --offload-summary: the offloading comparison and issue 50's targets (scripts/gpu-check.sh),
// printed and written. Exit code 1 when a row it compares failed or is missing; a missed target
// is only reported.
int write_offload_summary(const std::vector<bench::BenchRow>& rows,
                          const bench::BenchOptions& options, const std::string& path) {
  const bench::OffloadSummary summary = bench::offload_summary(rows, options);
  std::cout << summary.markdown;
  write_whole_file(path, summary.markdown, "--offload-summary");
  if (summary.missing.empty()) return kExitOk;
  std::string missing;
  for (const std::string& row : summary.missing) missing += (missing.empty() ? "" : ", ") + row;
  return report_error("--offload-summary: no measurement of " + missing, kExitFailure);
}

}  // namespace
#endif

namespace {

// --script: the Python side the harness runs. A path that names no file would only show as a
// skipped Python run, minutes later.
void check_script_path(const std::string& path) {
  if (path.empty()) return;
  std::error_code error;
  const std::filesystem::file_status status = std::filesystem::status(path, error);
  if (!std::filesystem::exists(status)) {
    throw UsageError("--script: '" + path + "' does not exist");
  }
  if (!std::filesystem::is_regular_file(status)) {
    throw UsageError("--script: '" + path + "' is not a regular file");
  }
}

// --device; UsageError when it is no device, or one this LibTorch or machine doesn't have.
c10::Device parse_device_option(const BenchArgs& args) {
  try {
    return models::parse_device(args.device);
  } catch (const std::invalid_argument& error) {
    throw UsageError(error.what());
  }
}

}  // namespace

int run_bench(const BenchArgs& given) {
  BenchArgs args = given;
  if (args.steps < 1)
    throw UsageError("--steps must be a positive integer, but got " + std::to_string(args.steps));
  if (args.warmup < 0)
    throw UsageError("--warmup must be >= 0, but got " + std::to_string(args.warmup));
  validate_threads(args.threads, MachineLimits::of_this_machine(), "--threads");
  const c10::Device device = parse_device_option(args);
  args.device = device.str();
  if (!args.device_profile_path.empty()) {
    at::set_num_threads(args.threads);
    const DeviceProfile profile = DeviceProfile::measure(device);
    profile.save(args.device_profile_path);
    std::cout << "device profile of " << profile.name << " written to " << args.device_profile_path
              << ": " << profile.flops_per_second / 1e9 << " GFLOP/s, "
              << profile.bytes_per_second / 1e9 << " GB/s, " << profile.seconds_per_operator * 1e6
              << " us per operator, memory " << format_bytes(profile.memory_bytes) << "\n";
    return kExitOk;
  }
  if (!args.offload_summary_path.empty() && device.is_cpu()) {
    throw UsageError(
        "--offload-summary: offloading moves activations from an accelerator to host memory, and "
        "--device cpu has none; use --device cuda or --device emulated");
  }
  for (size_t i = 0; i < args.models.size(); ++i) {
    const std::string& model = args.models[i];
    if (model != "mlp" && model != "resnet" && model != "transformer" && model != "small") {
      throw UsageError("--models: unknown model '" + model +
                       "'; choose among mlp, resnet, transformer, small");
    }
    if (std::find(args.models.begin(), args.models.begin() + i, model) != args.models.begin() + i)
      throw UsageError("--models: '" + model + "' is named twice; name each model once");
  }
  try {
    models::parse_storage_modes(args.storage_modes);
  } catch (const std::invalid_argument& error) {
    throw UsageError(error.what());
  }
  check_script_path(args.script);
  check_output_path(args.markdown_path, "--markdown");
  check_output_path(args.json_path, "--json");
  check_output_path(args.plot_path, "--plot");
  check_output_path(args.offload_summary_path, "--offload-summary");
#ifdef CKPT_CLI_HAVE_BENCH
  const bench::BenchOptions options = bench_options(args);
  const std::vector<bench::BenchRow> rows = bench::run_comparison(options);
  const std::string markdown = bench::to_markdown(rows, options);
  std::cout << markdown;
  if (!args.markdown_path.empty()) {
    write_whole_file(args.markdown_path, markdown, "--markdown");
  }
  if (!args.json_path.empty()) write_json(rows, args);
  if (!args.plot_path.empty()) write_charts(args.plot_path, bench_charts(rows), "--plot");
  if (!args.offload_summary_path.empty()) {
    return write_offload_summary(rows, options, args.offload_summary_path);
  }
  return kExitOk;
#else
  throw std::runtime_error(
      "ckpt bench is not available in this build: the benchmark harness (CMake target "
      "ckpt_bench_harness, bench/compare/) was not built. Reconfigure with "
      "-DCKPT_BUILD_TOOLS=ON");
#endif
}

}  // namespace cli
}  // namespace ckpt
