#pragma once

// The side-by-side benchmark: the same models through no checkpointing, ckpt's
// checkpoint_sequential, ckpt's planned schedules, and Python's torch.utils.checkpoint.
// The harness of the `ckpt bench` subcommand, its one command line (tools/ckpt/bench_command.cpp).

#include <cstdint>
#include <string>
#include <vector>

namespace ckpt {
namespace bench {

struct BenchOptions {
  std::vector<std::string> models;  // empty: all ("mlp", "resnet", "transformer", "small")
  int steps = 15;                   // timed steps per method (after warm-up)
  int warmup = 3;
  int threads = 1;
  bool python = true;                // also run torch.utils.checkpoint (skipped if unavailable)
  bool planned = true;               // also run PlannedSequential and PlannedModel at the peaks of
                                     // checkpoint_sequential
  bool quick = false;                // small sizes, few steps: for tests
  std::string python_executable;     // empty: CKPT_PYTHON at build time, else /usr/bin/python3
  std::string python_script;         // empty: bench/compare/torch_checkpoint.py of the source tree
  bool rss = true;                   // also measure each step's RSS high-water mark (Linux)
  bool resnet_batch_norm = true;     // false: the ResNet-like chain without BatchNorm layers
  std::string device = "cpu";        // where the C++ methods run ("cuda", "cuda:1", ...); peaks on
                                     // an accelerator come from its caching allocator's statistics
  bool every_segment_count = false;  // ckpt_sequential at every count 2..L, not only 2, 4, √L, L
  // The storage modes the planned rows' profile measures and their plans may use, as
  // `--storage-modes` spells them (models::parse_storage_modes).
  std::string storage_modes = "checkpointed,two_pass,selective";
};

struct BenchRow {
  std::string model;
  std::string method;      // "none", "ckpt_sequential", "python_sequential", "ckpt_planned",
                           // "ckpt_model_planned", ...
  std::string setting;     // "segments=4", "budget=12.3MiB", ...
  int64_t peak_bytes = 0;  // activation peak of one step (counting allocator, or RSS for Python)
  int64_t predicted_peak_bytes = -1;  // planned rows: the simulator's prediction
  double step_ms = 0;                 // median step time
  double overhead = 0;                // step time / the model's "none" step time
  double memory_ratio = 0;            // peak / the model's "none" peak
  int forward_count = 0;              // stage forwards per step
  // Added fields (the original ones above are the contract of `ckpt bench`):
  int segments = 0;             // checkpoint_sequential rows: the segment count (after clamping)
  int64_t budget_bytes = -1;    // planned rows: the budget given to the planner (x_0 included)
  int64_t rss_peak_bytes = -1;  // VmHWM - VmRSS before the step (-1: not measured)
  double rss_memory_ratio = 0;  // rss_peak_bytes / the same language's "none" RSS peak
  // Planned and "predicted_optimum" rows: the simulator's step time from the profile over the
  // plain chain's (predicted_overhead), and that times the measured plain step of the same timing
  // phase (predicted_step_ms, set with the ratios once every method is timed).
  double predicted_step_ms = -1;
  double predicted_overhead = 0;
  double step_iqr_ms = 0;  // interquartile range of the timed steps
  double solver_ms = -1;   // planned rows: wall time of solving the profiled chain
  // Planned rows: wall time of profiling the model for this row's planner, once per planner and
  // model (its budgets share the profile); PlannedModel's includes solving for its smallest plan.
  // With solver_ms, what a step that plans costs before it runs (issue 48's "first step").
  double planning_ms = -1;
  std::string note;  // e.g. why a planned budget is infeasible
};

/// Runs every selected model and method; prints progress to stderr.
std::vector<BenchRow> run_comparison(const BenchOptions& options);

/// The segment counts of the comparison for a chain of `stages` stages: {2, 4, round(sqrt(n)), n},
/// those above n dropped, sorted, without duplicates.
std::vector<int> segment_counts(int stages);

/// One markdown table per model, then the targets of issues 3 and 4 checked against the rows.
std::string to_markdown(const std::vector<BenchRow>& rows, const BenchOptions& options);

}  // namespace bench
}  // namespace ckpt
