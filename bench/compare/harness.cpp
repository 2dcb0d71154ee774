#include "harness.h"

#include "bench_models.h"
#include "process_memory.h"
#include "statistics.h"
#include "strategy.h"

#include <ckpt/memory_tracker.h>
#include <ckpt/plan/solvers.h>
#include <ckpt/planned_model.h>
#include <ckpt/planned_sequential.h>
#include <ckpt/profiler.h>
#include <ckpt/sequential.h>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>

#ifndef CKPT_BENCH_DEFAULT_PYTHON
#define CKPT_BENCH_DEFAULT_PYTHON ""
#endif
#ifndef CKPT_BENCH_COMPARE_DIR
#define CKPT_BENCH_COMPARE_DIR "bench/compare"
#endif

namespace ckpt {
namespace bench {

using models::build_model;
using models::describe;
using models::make_input;
using models::model_config;
using models::model_names;
using models::ModelConfig;
using models::to_json;
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

// One method under test: how to run the chain's forward, and its row.
struct Method {
  BenchRow row;
  std::function<torch::Tensor(const torch::Tensor&)> forward;
  std::vector<double> times_ms;
};

struct Stats {
  double median = 0, iqr = 0;
};

// The chain planner's profile, and the wall time it took.
struct ProfiledChain {
  plan::Chain chain;
  double milliseconds = 0;
};

double milliseconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

// Median and interquartile range (linear interpolation, as Python's statistics.quantiles with
// the "exclusive" method is close enough for n >= 15).
Stats stats(const std::vector<double>& v) {
  Stats s;
  s.median = models::median(v);
  s.iqr = models::quantile(v, 0.75) - models::quantile(v, 0.25);
  return s;
}

std::string mib(int64_t bytes, int precision = 2) {
  if (bytes < 0) return "—";
  std::ostringstream o;
  o.setf(std::ios::fixed);
  o.precision(precision);
  o << static_cast<double>(bytes) / kMiB;
  return o.str();
}

std::string fixed(double value, int precision) {
  std::ostringstream o;
  o.setf(std::ios::fixed);
  o.precision(precision);
  o << value;
  return o.str();
}

std::string percent(double ratio) {
  return ratio > 0 ? fixed(100.0 * ratio, 1) + "%" : "—";
}

// Everything one model's step needs: the chain, the input and the gradient buffers, allocated
// before any step so that a step's peak counts only what the step itself allocates.
struct Workbench {
  ModelConfig config;
  torch::nn::Sequential model;
  torch::Tensor x;
  std::vector<torch::Tensor> params;

  Workbench(const ModelConfig& c, const torch::Device& device) : config(c), model(build_model(c)) {
    model->train();
    model->to(device);
    x = make_input(c).to(device).requires_grad_(true);
    x.mutable_grad() = torch::zeros_like(x);
    params = model->parameters();
    for (auto& p : params) p.mutable_grad() = torch::zeros_like(p);
  }

  void zero_grad() {
    for (auto& p : params) p.mutable_grad().zero_();
    x.mutable_grad().zero_();
  }

  // One training step without the optimizer: forward, loss, backward (finished on the device).
  // The chain's output is not held past the loss (the planner's model frees it there; a variable
  // holding it through the backward would add it to every peak).
  void step(const Method& method) {
    auto loss = method.forward(x).square().mean();
    loss.backward();
    if (x.is_cuda()) torch::cuda::synchronize(x.device().index());
  }
};

// Runs `warmup` steps of a method, then one step whose peaks (counting allocator and RSS) are
// recorded in its row.
void warm_and_measure(Workbench& bench, Method& method, MemoryTracker& tracker, int warmup,
                      bool rss) {
  for (int i = 0; i < warmup; ++i) {
    bench.zero_grad();
    bench.step(method);
  }
  bench.zero_grad();
  const bool rss_ok = rss && reset_rss_peak();
  const int64_t rss_before = rss_ok ? rss_bytes() : -1;
  tracker.reset_peak();
  const int64_t before = tracker.current_bytes();
  bench.step(method);
  method.row.peak_bytes = tracker.peak_bytes() - before;
  if (rss_ok) method.row.rss_peak_bytes = rss_peak_bytes() - rss_before;
}

// warm_and_measure, but a method that throws is reported in its row's note and not timed.
void try_warm_and_measure(Workbench& bench, Method& method, MemoryTracker& tracker, int warmup,
                          bool rss) {
  try {
    warm_and_measure(bench, method, tracker, warmup, rss);
  } catch (const std::exception& e) {
    std::string what = e.what();
    what = what.substr(0, what.find('\n'));
    std::cerr << "ckpt bench: " << method.row.model << ": " << method.row.method << " "
              << method.row.setting << " failed: " << what << "\n";
    method.row.note = "failed: " + what;
    method.row.peak_bytes = -1;
    method.row.step_ms = -1;
    method.forward = nullptr;
  }
}

// The script given, else the one installed next to the program (share/ckpt), else the source
// tree's.
std::string python_script(const BenchOptions& options) {
  if (!options.python_script.empty()) return options.python_script;
  const std::string installed = executable_dir() + "/../share/ckpt/torch_checkpoint.py";
  if (file_exists(installed)) return installed;
  return std::string(CKPT_BENCH_COMPARE_DIR) + "/torch_checkpoint.py";
}

// The lower bound on the peak of any schedule of the step that runs LibTorch's backward operators
// whole (bench/compare/lower_bound.py, computed by the Python side on the CPU): a row with a peak
// and no step, so that plans and measured peaks read beside it.
BenchRow floor_row(const std::string& model, const nlohmann::json& floor) {
  BenchRow row;
  row.model = model;
  row.method = "floor";
  row.setting = "-";
  row.peak_bytes = floor["peak_bytes"].get<int64_t>();
  row.step_ms = -1;
  row.note = "no schedule peaks lower (lower_bound.py): " + floor["node"].get<std::string>();
  return row;
}

std::vector<BenchRow> run_python(const BenchOptions& options, const ModelConfig& config,
                                 const std::vector<int>& segments, int steps, int warmup) {
  std::string python = options.python_executable;
  // The Python configured at build time (the newest torch for LibTorch 2.x builds), else Debian's.
  if (python.empty()) python = CKPT_BENCH_DEFAULT_PYTHON;
  if (python.empty()) python = file_exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
  const std::string script = python_script(options);
  std::ostringstream cmd;
  cmd << "'" << python << "' '" << script << "' --config '" << to_json(config) << "' --segments ";
  for (size_t i = 0; i < segments.size(); ++i) cmd << (i ? "," : "") << segments[i];
  cmd << " --steps " << steps << " --warmup " << warmup << " --threads " << options.threads;
  if (!torch::Device(options.device).is_cpu()) cmd << " --device '" << options.device << "'";
  std::string output;
  const int status = run_command(cmd.str(), output);
  std::vector<BenchRow> rows;
  if (status != 0) {
    std::cerr << "ckpt bench: the Python run failed (status " << status << "); skipping it\n"
              << "  command: " << cmd.str() << "\n";
    return rows;
  }
  nlohmann::json result;
  try {
    const auto last = output.find_last_of('{', output.rfind("\"rows\""));
    result = nlohmann::json::parse(output.substr(last == std::string::npos ? 0 : last));
  } catch (const std::exception& e) {
    std::cerr << "ckpt bench: cannot parse the Python output (" << e.what() << "); skipping it\n";
    return rows;
  }
  for (const auto& r : result["rows"]) {
    BenchRow row;
    row.model = config.name;
    const int s = r["segments"].get<int>();
    // Named as the C++ twins are: the default (non-reentrant) variant has no suffix.
    const std::string variant = r.value("variant", r.value("reentrant", true) ? "reentrant" : "");
    row.method = s == 0                   ? "python_none"
                 : variant == "reentrant" ? "python_sequential_reentrant"
                 : variant == "selective" ? "python_selective"
                 : variant == "offload"   ? "python_offload"
                                          : "python_sequential";
    row.setting = s == 0 ? "-" : "segments=" + std::to_string(s);
    row.segments = s;
    row.rss_peak_bytes = r["rss_peak_bytes"].get<int64_t>();
    // On CUDA the device's peak (torch.cuda.max_memory_allocated), and no RSS; else the RSS peak.
    row.peak_bytes = r.value("peak_bytes", row.rss_peak_bytes);
    row.step_ms = r["step_ms"].get<double>();
    row.step_iqr_ms = r["iqr_ms"].get<double>();
    row.forward_count = r["forward_count"].get<int>();
    row.note = "torch " + result["torch_version"].get<std::string>();
    rows.push_back(row);
  }
  if (result.contains("floor")) rows.push_back(floor_row(config.name, result["floor"]));
  return rows;
}

using Methods = std::vector<std::unique_ptr<Method>>;
using Forward = std::function<torch::Tensor(const torch::Tensor&)>;

Method* add_method(Methods& methods, BenchRow row, Forward forward) {
  auto method = std::make_unique<Method>();
  method->row = std::move(row);
  method->forward = std::move(forward);
  methods.push_back(std::move(method));
  return methods.back().get();
}

// The plain model, then checkpoint_sequential at each segment count in both variants, selective,
// and with `offload` (an accelerator's chain) as offloaded regions; with `every_count` the
// non-reentrant variant at every other count from 2 to L (for the curve).
Methods sequential_methods(const std::string& name, torch::nn::Sequential model,
                           const std::vector<int>& segments, bool offload, bool every_count) {
  const int n = static_cast<int>(model->size());
  Methods methods;
  const auto row = [&](const std::string& method, int s) {
    BenchRow r;
    r.model = name;
    r.method = method;
    r.setting = s == 0 ? "-" : "segments=" + std::to_string(s);
    r.segments = s;
    r.forward_count = s == 0 ? n : n + (n / s) * (s - 1);
    return r;
  };
  add_method(methods, row("none", 0), models::chain_forward(models::Strategy{}, model));
  for (const int s : segments) {
    add_method(methods, row("ckpt_sequential", s),
               models::chain_forward(models::Strategy::sequential(s), model));
    add_method(methods, row("ckpt_sequential_reentrant", s),
               models::chain_forward(models::Strategy::sequential(s, /*reentrant=*/true), model));
    add_method(methods, row("ckpt_selective", s),
               models::chain_forward(models::Strategy::selective(s), model));
    if (!offload) continue;
    BenchRow offloaded = row("ckpt_offload", s);
    offloaded.forward_count = n;  // each stage runs once; its saved tensors move instead
    add_method(methods, offloaded, models::chain_forward(models::Strategy::offload(s), model));
    // The same without bringing the next region's data back ahead: what the look-ahead hides.
    models::Strategy one_at_a_time = models::Strategy::offload(s);
    one_at_a_time.offload_options.look_ahead(0);
    offloaded.method = "ckpt_offload_no_look_ahead";
    add_method(methods, offloaded, models::chain_forward(one_at_a_time, model));
  }
  for (int s = 2; every_count && s <= n; ++s) {
    if (std::find(segments.begin(), segments.end(), s) != segments.end()) continue;
    add_method(methods, row("ckpt_sequential", s),
               models::chain_forward(models::Strategy::sequential(s), model));
  }
  return methods;
}

// The planner's budgets: the measured peaks of the other methods, 15% of none, and the smallest
// feasible one. Budgets in the planner's terms include x_0; the measured peaks exclude it (it
// lives before the step), so a budget of "peak P" is P + input_bytes.
std::vector<std::pair<int64_t, std::string>> planned_budgets(const Methods& methods,
                                                             int64_t input_bytes,
                                                             int64_t min_budget) {
  const int64_t none_peak = methods.front()->row.peak_bytes;
  std::vector<std::pair<int64_t, std::string>> budgets;
  budgets.emplace_back(none_peak + input_bytes, "none peak");
  for (const auto& m : methods) {
    if (m->row.method != "ckpt_sequential" || m->row.peak_bytes < 0) continue;
    budgets.emplace_back(m->row.peak_bytes + input_bytes, m->row.setting + " peak");
  }
  budgets.emplace_back(static_cast<int64_t>(0.15 * static_cast<double>(none_peak)) + input_bytes,
                       "15% of none");
  budgets.emplace_back(min_budget, "min feasible");
  return budgets;
}

// A planner's row for one budget (which counts `input_bytes`, the input the peaks leave out);
// below `min_budget` its note says that the budget is infeasible, and what the smallest is.
BenchRow planner_row(const Methods& methods, const std::string& name, const std::string& method,
                     int64_t budget, const std::string& label, int64_t input_bytes,
                     int64_t min_budget) {
  BenchRow row;
  row.model = name;
  row.method = method;
  row.budget_bytes = budget;
  row.setting = "budget=" + mib(budget - input_bytes) + "MiB (" + label + ")";
  row.peak_bytes = -1;
  row.step_ms = -1;
  if (budget >= min_budget) return row;
  const int64_t none_peak = methods.front()->row.peak_bytes;
  row.note =
      "infeasible: the smallest feasible budget is " + mib(min_budget - input_bytes) + " MiB (" +
      percent(static_cast<double>(min_budget - input_bytes) / static_cast<double>(none_peak)) +
      " of none)";
  return row;
}

// A PlannedSequential method for one budget, or a row that says why there is none.
void add_planned_method(Methods& methods, const std::string& name, torch::nn::Sequential model,
                        const ProfiledChain& profiled, const StorageModes& modes, int64_t budget,
                        const std::string& label, int64_t input_bytes, int64_t min_budget,
                        double plain_time) {
  const plan::Chain& profile = profiled.chain;
  BenchRow row = planner_row(methods, name, "ckpt_planned", budget, label, input_bytes, min_budget);
  row.planning_ms = profiled.milliseconds;
  if (budget < min_budget) {
    add_method(methods, row, nullptr);
    return;
  }
  PlannedSequential planned(model, Budget::bytes(budget),
                            PlannedSequentialOptions().solver("optimal").storage_modes(modes));
  const auto t0 = std::chrono::steady_clock::now();
  try {
    planned->plan(profile);
  } catch (const std::exception& e) {
    row.note = std::string("plan failed: ") + e.what();
    add_method(methods, row, nullptr);
    return;
  }
  row.solver_ms = milliseconds_since(t0);
  row.predicted_peak_bytes = planned->prediction().peak_bytes - input_bytes;
  row.predicted_overhead = planned->prediction().time / plain_time;
  row.forward_count = planned->prediction().forward_count;
  add_method(methods, row,
             [planned](const torch::Tensor& x) mutable { return planned->forward(x); });
}

// The optimum the planner predicts from the profile at 24 budgets from the smallest feasible one
// to the plain chain's predicted peak: rows that are not run, for the curve.
void add_predicted_optimum(Methods& methods, const std::string& name, const plan::Chain& profile,
                           int64_t input_bytes, double plain_time) {
  const int64_t none_peak = methods.front()->row.peak_bytes;
  const int64_t low = plan::min_feasible_budget_bytes(profile);
  const int64_t high = plan::simulate(profile, plan::solve_no_checkpoint(profile)).peak_bytes;
  constexpr int kPoints = 24;
  for (int k = 0; k < kPoints; ++k) {
    const int64_t budget = low + (high - low) * k / (kPoints - 1);
    const auto schedule = plan::solve_optimal(profile, budget);
    if (!schedule) continue;
    const plan::SimulationResult predicted = plan::simulate(profile, *schedule);
    BenchRow row;
    row.model = name;
    row.method = "predicted_optimum";
    row.setting = "budget=" + mib(budget - input_bytes) + "MiB";
    row.budget_bytes = budget;
    row.peak_bytes = -1;
    row.step_ms = -1;
    row.predicted_peak_bytes = predicted.peak_bytes - input_bytes;
    row.predicted_overhead = predicted.time / plain_time;
    row.overhead = row.predicted_overhead;
    row.memory_ratio =
        static_cast<double>(row.predicted_peak_bytes) / static_cast<double>(none_peak);
    row.forward_count = predicted.forward_count;
    add_method(methods, row, nullptr);
  }
}

// The planner's chain, profiled with the heap of the timing phase, as the steps it predicts are
// timed: with the memory phase's small mmap threshold, every activation of 64 KiB or more would
// be a fresh mapping and its page faults (1.4x on the MLP, whose activations are 128 KiB). The
// workbench's steps start from its gradient buffers, so the parameters' gradients are not
// counted: counted, every prediction was high by the gradients made before its peak.
ProfiledChain profile_for_planner(const BenchOptions& options, const std::string& name,
                                  Workbench& bench) {
  std::cerr << "ckpt bench: " << name << ": profiling the chain for the planner\n";
  const std::vector<torch::nn::AnyModule> stages(bench.model->begin(), bench.model->end());
  ProfileOptions profile_options;
  profile_options.count_parameter_gradients(false);
  profile_options.storage_modes(models::parse_storage_modes(options.storage_modes));
  if (options.quick) profile_options.repeats(1).warmup(0);
  use_large_mmap_threshold();
  const auto t0 = std::chrono::steady_clock::now();
  plan::Chain chain = profile_chain(stages, bench.x.detach(), profile_options);
  return {std::move(chain), milliseconds_since(t0)};
}

void add_planned_methods(const std::string& name, const ProfiledChain& profiled,
                         const StorageModes& modes, Workbench& bench, MemoryTracker& tracker,
                         int warmup, bool rss, Methods& methods) {
  const plan::Chain& profile = profiled.chain;
  const int64_t min_budget = plan::min_feasible_budget_bytes(profile);
  const auto input_bytes = static_cast<int64_t>(bench.x.nbytes());
  const double plain_time = plan::simulate(profile, plan::solve_no_checkpoint(profile)).time;
  for (const auto& [budget, label] : planned_budgets(methods, input_bytes, min_budget)) {
    add_planned_method(methods, name, bench.model, profiled, modes, budget, label, input_bytes,
                       min_budget, plain_time);
    Method& added = *methods.back();
    if (added.forward) try_warm_and_measure(bench, added, tracker, warmup, rss);
  }
  add_predicted_optimum(methods, name, profile, input_bytes, plain_time);
}

// A PlannedModel's profile measured in parts, as its first step measures it (`measure_as_needed`):
// after the storage modes, and after each longer chain, what is measured and the seconds so far.
struct ProfileInParts {
  std::vector<MeasuredModel> parts;
  std::vector<double> milliseconds;
};

ProfileInParts profile_in_parts(Workbench& bench, const StorageModes& modes) {
  // Its steps hold nothing from one to the next, as the bench's don't: an output kept in a
  // captured variable until the next forward ends would read as memory that step frees.
  const std::function<torch::Tensor()> loss = [model = bench.model, x = bench.x]() mutable {
    return model->forward(x).square().mean();
  };
  ProfileInParts profile;
  const auto t0 = std::chrono::steady_clock::now();
  ModelProfiler profiler(
      bench.model.ptr(), loss,
      ModelProfileOptions().count_parameter_gradients(false).storage_modes(modes));
  while (true) {
    profile.milliseconds.push_back(milliseconds_since(t0));
    profile.parts.push_back(profiler.measured());
    if (profiler.complete()) return profile;
    profiler.measure_more(loss);
  }
}

// ckpt::PlannedModel on the same model, whose blocks mark their candidates inside (the MLPs mark
// none: no rows), at the chain planner's budgets and with its storage modes. Its budgets leave out
// the input, which lives before the step; the step starts from the gradient buffers the workbench
// keeps. Each budget is planned from the profile its first step would measure (the chains only as
// far as the budget needs them), and its planning is that profile's time.
void add_model_planned_methods(const std::string& name, const StorageModes& modes, Workbench& bench,
                               MemoryTracker& tracker, int warmup, bool rss, Methods& methods) {
  const PlannedModelOptions options =
      PlannedModelOptions().count_parameter_gradients(false).storage_modes(modes);
  auto loss_of = [model = bench.model, x = bench.x](torch::Tensor& out) {
    return [model, x, &out]() mutable {
      out = model->forward(x);
      return out.square().mean();
    };
  };
  ProfileInParts profile;
  int64_t min_budget = 0;
  try {
    profile = profile_in_parts(bench, modes);
    PlannedModel probe(bench.model, Budget::minimum(), options);
    probe.plan(MeasuredModel(profile.parts.back()));
    min_budget = probe.budget_bytes();
  } catch (const c10::Error& e) {
    std::cerr << "ckpt bench: " << name << ": no ckpt_model_planned rows: "
              << std::string(e.what_without_backtrace()).substr(0, 80) << "\n";
    return;
  }
  for (const auto& [budget, label] : planned_budgets(methods, 0, min_budget)) {
    BenchRow row = planner_row(methods, name, "ckpt_model_planned", budget, label, 0, min_budget);
    if (budget < min_budget) {
      row.planning_ms = profile.milliseconds.back();
      add_method(methods, row, nullptr);
      continue;
    }
    auto planned = std::make_shared<PlannedModel>(bench.model, Budget::bytes(budget), options);
    // The first part a plan fits in, as the first step stops there.
    for (size_t part = 0; part < profile.parts.size(); ++part) {
      const auto solve_start = std::chrono::steady_clock::now();
      try {
        planned->plan(MeasuredModel(profile.parts[part]));
      } catch (const InfeasibleBudget&) {
        continue;
      }
      row.solver_ms = milliseconds_since(solve_start);
      row.planning_ms = profile.milliseconds[part];
      break;
    }
    const MeasuredModel& measured = planned->measured();
    row.predicted_peak_bytes = planned->solution().prediction.peak_bytes;
    row.predicted_overhead = planned->solution().prediction.time / measured.profile.step_time;
    Method* added = add_method(methods, row, [planned, loss_of](const torch::Tensor&) {
      torch::Tensor out;  // the chain's output: the workbench's loss is taken from it
      planned->run(loss_of(out));
      return out;
    });
    try_warm_and_measure(bench, *added, tracker, warmup, rss);
  }
}

// Timed steps, interleaved: round r runs every method once, starting at a rotating offset. The
// heap keeps freed memory (no mmap and page faults per tensor); one untimed round first.
void time_methods(const std::string& name, Workbench& bench, Methods& methods, int steps) {
  std::vector<Method*> runnable;
  for (auto& m : methods) {
    if (m->forward) runnable.push_back(m.get());
  }
  use_large_mmap_threshold();
  for (Method* m : runnable) {
    bench.zero_grad();
    bench.step(*m);
  }
  std::cerr << "ckpt bench: " << name << ": timing " << runnable.size() << " methods x " << steps
            << " steps\n";
  for (int r = 0; r < steps; ++r) {
    for (size_t j = 0; j < runnable.size(); ++j) {
      Method& m = *runnable[(j + static_cast<size_t>(r)) % runnable.size()];
      bench.zero_grad();
      const auto t0 = std::chrono::steady_clock::now();
      bench.step(m);
      m.times_ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  for (auto& m : methods) {
    if (!m->forward) continue;
    const Stats s = stats(m->times_ms);
    m->row.step_ms = s.median;
    m->row.step_iqr_ms = s.iqr;
  }
}

// Whether the row's peak_bytes is the allocator's: every C++ row, and Python's on CUDA (where it
// measures torch.cuda.max_memory_allocated and no RSS). Python's on the CPU is its RSS peak.
bool device_peak(const BenchRow& row) {
  return row.method.rfind("python", 0) != 0 || row.rss_peak_bytes < 0;
}

// Ratios against the same language's no-checkpoint row (the first C++ row is "none").
void add_ratios(std::vector<BenchRow>& rows) {
  const BenchRow* cpp_none = &rows.front();
  const BenchRow* py_none = nullptr;
  for (const auto& row : rows) {
    if (row.method == "python_none") py_none = &row;
  }
  for (auto& row : rows) {
    // A predicted step is the predicted overhead times the plain step of this timing phase: the
    // profile's own calibration times steps back to back, this phase interleaves every method,
    // which runs each step from colder caches (about 1.2x slower on the MLP).
    if (row.predicted_overhead > 0 && cpp_none->step_ms > 0) {
      row.predicted_step_ms = row.predicted_overhead * cpp_none->step_ms;
    }
    const bool py = row.method.rfind("python", 0) == 0;
    const BenchRow* base = py ? py_none : cpp_none;
    if (base != nullptr && device_peak(row) && row.peak_bytes >= 0 && base->peak_bytes > 0) {
      row.memory_ratio =
          static_cast<double>(row.peak_bytes) / static_cast<double>(base->peak_bytes);
    }
    if (base == nullptr || row.step_ms <= 0) continue;
    row.overhead = row.step_ms / base->step_ms;
    if (row.rss_peak_bytes >= 0 && base->rss_peak_bytes > 0) {
      row.rss_memory_ratio =
          static_cast<double>(row.rss_peak_bytes) / static_cast<double>(base->rss_peak_bytes);
      if (py) row.memory_ratio = row.rss_memory_ratio;
    }
  }
}

std::vector<BenchRow> run_model(const BenchOptions& options, const std::string& name,
                                MemoryTracker& tracker) {
  ModelConfig config = model_config(name, options.quick);
  if (!options.resnet_batch_norm) {
    config.batch_norm = false;
    config.description = describe(config);
  }
  const int steps = options.quick ? std::min(options.steps, 3) : std::max(options.steps, 1);
  const int warmup = options.quick ? std::min(options.warmup, 1) : std::max(options.warmup, 0);
  std::cerr << "ckpt bench: " << name << ": " << config.description << "\n";

  Workbench bench(config, torch::Device(options.device));
  // The ResNet's blocks marked over the halves they mark inside, for PlannedModel, before any row
  // runs: every row runs the same elements (a marker without a planner is the plain call).
  models::mark_residual_blocks(bench.model);
  const auto segments = segment_counts(static_cast<int>(bench.model->size()));
  const torch::Device device(options.device);
  Methods methods = sequential_methods(name, bench.model, segments, !device.is_cpu(),
                                       options.every_segment_count);
  const std::optional<ProfiledChain> profile =
      options.planned ? std::optional(profile_for_planner(options, name, bench)) : std::nullopt;
  // Memory phase: every method's warm-up and measured step, with small allocations returned to
  // the system so that RSS follows the live tensors.
  use_small_mmap_threshold();
  for (auto& m : methods) try_warm_and_measure(bench, *m, tracker, warmup, options.rss);
  if (profile) {
    const StorageModes modes = models::parse_storage_modes(options.storage_modes);
    add_planned_methods(name, *profile, modes, bench, tracker, warmup, options.rss, methods);
    add_model_planned_methods(name, modes, bench, tracker, warmup, options.rss, methods);
  }
  time_methods(name, bench, methods, steps);

  std::vector<BenchRow> rows;
  for (auto& m : methods) rows.push_back(m->row);
  if (options.python && (device.is_cpu() || device.is_cuda())) {
    std::cerr << "ckpt bench: " << name << ": running torch.utils.checkpoint on " << device << "\n";
    for (auto& row : run_python(options, config, segments, steps, warmup)) {
      // The floor reads best beside the plain step.
      rows.insert(row.method == "floor" ? rows.begin() + 1 : rows.end(), row);
    }
  }
  add_ratios(rows);
  return rows;
}

const BenchRow* find(const std::vector<BenchRow>& rows, const std::string& model,
                     const std::string& method, int segments) {
  for (const auto& row : rows) {
    if (row.model == model && row.method == method && row.segments == segments) return &row;
  }
  return nullptr;
}

// The Python row that runs what a C++ method runs: ckpt_sequential[_reentrant] ->
// python_sequential[_reentrant], ckpt_offload -> python_offload (save_on_cpu).
std::string python_twin(const std::string& cpp_method) {
  return "python" + cpp_method.substr(std::string("ckpt").size());
}

}  // namespace

std::vector<int> segment_counts(int stages) {
  std::vector<int> out;
  for (const int s : {2, 4, static_cast<int>(std::lround(std::sqrt(stages))), stages}) {
    if (s >= 2 && s <= stages && std::find(out.begin(), out.end(), s) == out.end()) {
      out.push_back(s);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<BenchRow> run_comparison(const BenchOptions& options) {
  torch::set_num_threads(options.threads);
  // On the CPU, the tracker installs the counting allocator before any model exists.
  MemoryTracker tracker{torch::Device(options.device)};
  const auto names = options.models.empty() ? model_names() : options.models;
  std::vector<BenchRow> rows;
  for (const auto& name : names) {
    for (auto& row : run_model(options, name, tracker)) rows.push_back(std::move(row));
  }
  return rows;
}

namespace {

std::vector<std::string> models_in(const std::vector<BenchRow>& rows) {
  std::vector<std::string> models;
  for (const auto& row : rows) {
    if (std::find(models.begin(), models.end(), row.model) == models.end()) {
      models.push_back(row.model);
    }
  }
  return models;
}

std::string model_heading(const std::string& name, const std::vector<BenchRow>& rows,
                          const BenchOptions& options) {
  ModelConfig config = model_config(name, options.quick);
  if (!options.resnet_batch_norm) {
    config.batch_norm = false;
    config.description = describe(config);
  }
  int stages = 0;
  for (const auto& row : rows) {
    if (row.model == name && row.method == "none") stages = row.forward_count;
  }
  return "### " + name + ": " + config.description + " (" + std::to_string(stages) + " stages)\n\n";
}

std::string prediction_error(const BenchRow& row) {
  if (row.predicted_peak_bytes <= 0 || row.peak_bytes < 0) return "—";
  const double err = static_cast<double>(row.peak_bytes - row.predicted_peak_bytes) /
                     static_cast<double>(row.predicted_peak_bytes);
  return (err >= 0 ? "+" : "") + fixed(100 * err, 1) + "%";
}

// The row's step time over its Python twin's (the same method in torch.utils.checkpoint).
std::string python_ratio(const BenchRow& row, const std::vector<BenchRow>& rows) {
  const BenchRow* twin = nullptr;
  if (row.method == "none") twin = find(rows, row.model, "python_none", 0);
  if (row.method.rfind("ckpt_sequential", 0) == 0 || row.method == "ckpt_selective" ||
      row.method == "ckpt_offload") {
    twin = find(rows, row.model, python_twin(row.method), row.segments);
  }
  if (!twin || twin->step_ms <= 0 || row.step_ms <= 0) return "—";
  return fixed(row.step_ms / twin->step_ms, 3) + "×";
}

std::string markdown_row(const BenchRow& row, const std::vector<BenchRow>& rows) {
  const bool rss_only = !device_peak(row);
  const bool timed = row.step_ms > 0;
  std::string note = row.note;
  if (row.solver_ms >= 0)
    note += (note.empty() ? "" : "; ") + ("solve " + fixed(row.solver_ms, 1) + " ms");
  const BenchRow* none = find(rows, row.model, "none", 0);
  if (row.planning_ms >= 0 && row.solver_ms >= 0 && none != nullptr && none->step_ms > 0) {
    // Issue 48's first step: what planning costs, profile and solve, in plain steps.
    note += "; profile " + fixed(row.planning_ms / 1000, 2) + " s, planning " +
            fixed((row.planning_ms + row.solver_ms) / none->step_ms, 1) + "× none's step";
  }
  std::ostringstream md;
  md << "| " << row.method << " | " << row.setting << " | "
     << (row.forward_count > 0 ? std::to_string(row.forward_count) : "—") << " | "
     << (rss_only ? "—" : mib(row.peak_bytes)) << " | "
     << (rss_only ? "—" : percent(row.memory_ratio)) << " | " << mib(row.rss_peak_bytes) << " | "
     << percent(row.rss_memory_ratio) << " | "
     << (row.predicted_peak_bytes >= 0 ? mib(row.predicted_peak_bytes) : "—") << " | "
     << prediction_error(row) << " | " << (timed ? fixed(row.step_ms, 2) : "—") << " | "
     << (timed ? fixed(row.step_iqr_ms, 2) : "—") << " | "
     << (row.predicted_step_ms > 0 ? fixed(row.predicted_step_ms, 2) : "—") << " | "
     << (row.overhead > 0 ? fixed(row.overhead, 3) + "×" : "—") << " | " << python_ratio(row, rows)
     << " | " << note << " |\n";
  return md.str();
}

}  // namespace

std::string to_markdown(const std::vector<BenchRow>& rows, const BenchOptions& options) {
  std::ostringstream md;
  for (const auto& name : models_in(rows)) {
    md << model_heading(name, rows, options);
    md << "| method | setting | fwd | peak MiB | % none | RSS peak MiB | % none (RSS) | predicted "
          "MiB | pred. error | step ms | IQR ms | pred. ms | overhead | C++ / Python | notes |\n";
    md << "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n";
    for (const auto& row : rows) {
      if (row.model == name && row.method != "predicted_optimum") md << markdown_row(row, rows);
    }
    md << "\n";
  }
  md << "\n";
  return md.str();
}

}  // namespace bench
}  // namespace ckpt
