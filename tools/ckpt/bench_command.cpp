#include "bench_command.h"

#include "device_option.h"
#include "errors.h"
#include "output_path.h"
#include "strategy.h"
#include "svg_chart.h"
#include "train_args.h"
#include "units.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <iostream>
#include <stdexcept>

#ifdef CKPT_CLI_HAVE_BENCH
#include "compare/harness.h"
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
                   std::string("Device of the C++ methods: ") + kDeviceChoices +
                       " (emulated: ckpt's emulated accelerator; Python runs on the CPU only)")
      ->capture_default_str();
  command->add_flag("--no-python", args.no_python, "Skip torch.utils.checkpoint");
  command->add_flag("--no-planned", args.no_planned, "Skip ckpt's planned schedules");
  command->add_option("--storage-modes", args.storage_modes, models::storage_modes_help())
      ->type_name("LIST")
      ->capture_default_str();
  command
      ->add_option("--python", args.python,
                   "Python interpreter with torch (default: the one ckpt was built with, else "
                   "/usr/bin/python3)")
      ->type_name("PATH");
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
  options.storage_modes = args.storage_modes;
  options.python_executable = args.python;
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
                    {"forward_count", row.forward_count}});
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

}  // namespace
#endif

int run_bench(const BenchArgs& given) {
  BenchArgs args = given;
  if (args.steps < 1)
    throw UsageError("--steps must be a positive integer, but got " + std::to_string(args.steps));
  if (args.warmup < 0)
    throw UsageError("--warmup must be >= 0, but got " + std::to_string(args.warmup));
  validate_threads(args.threads, MachineLimits::of_this_machine(), "--threads");
  args.device = parse_device_option(args.device).str();
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
  check_output_path(args.markdown_path, "--markdown");
  check_output_path(args.json_path, "--json");
  check_output_path(args.plot_path, "--plot");
#ifdef CKPT_CLI_HAVE_BENCH
  const std::vector<bench::BenchRow> rows = bench::run_comparison(bench_options(args));
  const std::string markdown = bench::to_markdown(rows, bench_options(args));
  std::cout << markdown;
  if (!args.markdown_path.empty()) {
    write_whole_file(args.markdown_path, markdown, "--markdown");
  }
  if (!args.json_path.empty()) write_json(rows, args);
  if (!args.plot_path.empty()) write_charts(args.plot_path, bench_charts(rows), "--plot");
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
