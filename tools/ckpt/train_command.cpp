#include "train_command.h"

#include "chain_json.h"
#include "chrome_trace.h"
#include "corpus.h"
#include "device_option.h"
#include "errors.h"
#include "gpt.h"
#include "memory_plot.h"
#include "output_path.h"
#include "peak_report.h"
#include "progress.h"
#include "statistics.h"
#include "strategy.h"
#include "train_distributed.h"
#include "train_recorder.h"
#include "train_strategy.h"
#include "train_unet.h"
#include "units.h"

#include <ckpt/memory_label.h>
#include <ckpt/memory_tracker.h>
#include <ckpt/planned_sequential.h>
#include <ckpt/report.h>
#include <ckpt/sequential.h>

#include <torch/torch.h>
#include <torch/version.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <optional>

namespace ckpt {
namespace cli {

using models::GptConfig;
using models::make_gpt;
using models::set_probe;

GptConfig gpt_config(const TrainArgs& args, const Corpus& corpus) {
  GptConfig config;
  config.vocab = static_cast<int64_t>(corpus.vocabulary.size());
  config.layers = args.layers;
  config.width = args.width;
  config.heads = args.heads;
  config.context = args.context;
  config.dropout = args.dropout;
  config.tied = !args.untied;
  return config;
}

nlohmann::json config_json(const TrainArgs& args) {
  return {{"layers", args.layers},   {"width", args.width}, {"heads", args.heads},
          {"context", args.context}, {"batch", args.batch}, {"steps", args.steps},
          {"threads", args.threads}, {"seed", args.seed},   {"lr", args.lr},
          {"dropout", args.dropout}, {"dtype", args.dtype}, {"tied", !args.untied},
          {"device", args.device}};
}

namespace {

volatile std::sig_atomic_t g_interrupted = 0;

extern "C" void on_sigint(int) {
  g_interrupted = 1;
}

// Ctrl-C stops after the current step; a second Ctrl-C ends the program at once.
class SigintGuard {
 public:
  SigintGuard() {
    g_interrupted = 0;
    struct sigaction action {};
    action.sa_handler = on_sigint;
    action.sa_flags = SA_RESETHAND;
    sigemptyset(&action.sa_mask);
    sigaction(SIGINT, &action, &previous_);
  }
  ~SigintGuard() { sigaction(SIGINT, &previous_, nullptr); }

 private:
  struct sigaction previous_ {};
};

using models::Strategy;

// `--device` (models/device_option.h, which installs the emulated accelerator when it names it);
// UsageError when it is no device, or one this LibTorch or machine doesn't have.
c10::Device parse_device_option(const TrainArgs& args) {
  try {
    return models::parse_device(args.device);
  } catch (const std::invalid_argument& error) {
    throw UsageError(error.what());
  }
}

// `--strategy` for the GPT's chain of layers + 2 stages; UsageError when it is invalid.
Strategy parse_strategy(const TrainArgs& args) {
  Strategy strategy;
  try {
    strategy = models::parse_strategy(args.strategy, args.layers + 2, " = layers + 2");
    strategy.storage_modes = models::parse_storage_modes(args.storage_modes);
  } catch (const std::invalid_argument& error) {
    throw UsageError(error.what());
  }
  // The reentrant variant differentiates a segment through its inputs only (as PyTorch's does):
  // the first segment's input, token ids, needs no gradient, so its parameters would not train.
  if (strategy.reentrant) {
    throw UsageError("--strategy " + strategy.text +
                     ": the reentrant variant would leave the first segment's parameters without "
                     "gradients (its input, token ids, needs none); use sequential:K");
  }
  // An offloaded region refuses host data: say so before any run, naming the devices that work.
  if (strategy.kind == Strategy::Kind::Offload && c10::Device(args.device).is_cpu()) {
    throw UsageError("--strategy " + strategy.text +
                     ": offloading moves activations from an accelerator to host memory, and "
                     "--device cpu has none; use --device emulated or --device cuda");
  }
  return strategy;
}

struct RunResult {
  std::string label;
  std::vector<float> losses;
  std::vector<double> step_ms;
  std::vector<int64_t> peak_bytes;
  bool interrupted = false;
  std::vector<std::pair<double, int64_t>> memory_samples;
  std::unique_ptr<StepRecorder> recorder;
  // --trace: the breakdown of the highest step peak (as peak() chooses) and of the traced step.
  std::optional<StepPeak> peak_breakdown, traced_breakdown;
  // Planned strategy only.
  int64_t budget_bytes = -1;
  int64_t predicted_peak_bytes = -1;
  int forward_count = 0;
  std::string schedule;
  nlohmann::json profile;
  // --report, the strategy's run: what its first step's forward keeps for the backward.
  std::optional<KeptReport> kept_report;

  int steps() const { return static_cast<int>(losses.size()); }
  // The warm-up step (AdamW allocates its state in the first step) is left out when possible.
  int64_t peak() const {
    if (peak_bytes.empty()) return 0;
    const auto begin = peak_bytes.size() > 1 ? peak_bytes.begin() + 1 : peak_bytes.begin();
    return *std::max_element(begin, peak_bytes.end());
  }
  double median_ms(int instrumented_step) const {
    std::vector<double> times;
    for (size_t i = 0; i < step_ms.size(); ++i) {
      if ((i == 0 || static_cast<int>(i) == instrumented_step) && step_ms.size() > 2) continue;
      times.push_back(step_ms[i]);
    }
    return models::median(std::move(times));
  }
};

std::vector<std::string> stage_names(int64_t layers) {
  std::vector<std::string> names{"embedding"};
  for (int64_t i = 1; i <= layers; ++i) names.push_back("block " + std::to_string(i));
  names.emplace_back("head");
  return names;
}

// A batch of token ids [batch, context] on the run's device.
torch::Tensor to_tensor(const std::vector<int64_t>& values, const TrainArgs& args) {
  return torch::from_blob(const_cast<int64_t*>(values.data()), {args.batch, args.context},
                          torch::kLong)
      .to(c10::Device(args.device), /*non_blocking=*/false, /*copy=*/true);
}

// The measured chain in the format of `ckpt plan --chain`.
void write_chain(const std::string& path, const plan::Chain& chain) {
  write_whole_file(path, chain_to_json(chain).dump(2) + "\n", "--chain");
}

// A batch from a generator of its own for profiling, so that training sees the same batches.
torch::Tensor profiling_batch(const TrainArgs& args, const Corpus& corpus) {
  std::mt19937_64 sample_rng(args.seed ^ 0x5eedULL);
  std::vector<int64_t> inputs, targets;
  sample_batch(corpus, args.batch, args.context, sample_rng, inputs, targets);
  return to_tensor(inputs, args);
}

using Forward = std::function<torch::Tensor(const torch::Tensor&)>;

// Profiles the chain and solves for the budget; the plan goes into `result`.
Forward plan_budget(const TrainArgs& args, const Corpus& corpus, const Strategy& strategy,
                    torch::nn::Sequential& chain, PlannedSequential& planned, RunResult& result) {
  planned = PlannedSequential(chain, strategy.budget,
                              PlannedSequentialOptions().storage_modes(strategy.storage_modes));
  std::cerr << "[" << result.label << "] profiling " << args.layers + 2
            << " stages and solving for the budget...\n";
  try {
    planned->plan(profiling_batch(args, corpus));
  } catch (const InfeasibleBudget& error) {
    throw UsageError("--strategy " + strategy.text + ": no schedule fits; the smallest feasible " +
                     "budget of this model is " + format_bytes(error.smallest_feasible_bytes()) +
                     " (" + std::to_string(error.smallest_feasible_bytes()) +
                     " bytes). Use --strategy budget:min, or a larger budget");
  } catch (const c10::Error& error) {
    throw UsageError("--strategy " + strategy.text + ": " + error.what_without_backtrace());
  }
  result.budget_bytes = planned->budget_bytes();
  result.predicted_peak_bytes = planned->prediction().peak_bytes;
  result.forward_count = planned->prediction().forward_count;
  result.schedule = plan::to_string(planned->schedule());
  result.profile = chain_to_json(planned->profile());
  if (!args.chain_path.empty()) write_chain(args.chain_path, planned->profile());
  if (result.recorder) planned->set_observer(result.recorder->observer());
  return [&planned](const torch::Tensor& x) { return planned->forward(x); };
}

// How a step runs the model under the strategy.
Forward prepare_strategy(const TrainArgs& args, const Corpus& corpus, const Strategy& strategy,
                         torch::nn::Sequential& chain, PlannedSequential& planned,
                         RunResult& result) {
  if (strategy.kind == Strategy::Kind::Budget) {
    return plan_budget(args, corpus, strategy, chain, planned, result);
  }
  if (!args.chain_path.empty()) {
    const std::vector<torch::nn::AnyModule> stages(chain->begin(), chain->end());
    write_chain(args.chain_path, ckpt::profile_chain(stages, profiling_batch(args, corpus)));
  }
  if (result.recorder) set_probe(chain, result.recorder.get());
  return models::chain_forward(strategy, chain);
}

// Called before each read of the clock: CUDA runs a step's kernels asynchronously. (The emulated
// device's default stream runs them at once, as the CPU does.)
void wait_for_device(const c10::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

// One step: forward, loss, backward and the optimizer, timed phase by phase; the instrumented
// step also records its operations and memory. Returns the loss.
double train_step(const Forward& forward, const torch::Tensor& x, const torch::Tensor& y,
                  int64_t vocab, torch::optim::Optimizer& optimizer, MemoryTracker& tracker,
                  MemorySampler* sampler, RunResult& result) {
  StepRecorder* recorder = sampler != nullptr ? result.recorder.get() : nullptr;
  const int64_t base_bytes = tracker.current_bytes();
  tracker.reset_peak();
  const Clock::time_point t0 = Clock::now();
  if (recorder != nullptr) {
    recorder->begin(t0);
    sampler->start(t0, base_bytes);
  }
  double loss_value = 0;
  Clock::time_point t1, t2, t3;
  {
    // Memory labels for the peak's breakdown (--trace); the stages label their own forwards.
    std::optional<MemoryLabel> label(std::in_place, "forward");
    const torch::Tensor logits = forward(x);
    wait_for_device(x.device());
    t1 = Clock::now();
    label.emplace("loss");
    const torch::Tensor loss =
        torch::nn::functional::cross_entropy(logits.view({-1, vocab}), y.view({-1}));
    wait_for_device(x.device());
    t2 = Clock::now();
    if (recorder != nullptr) recorder->begin_backward();
    label.emplace("backward");
    loss.backward();
    wait_for_device(x.device());
    t3 = Clock::now();
    if (recorder != nullptr) recorder->end();
    loss_value = loss.item<float>();
  }
  {
    const MemoryLabel label("optimizer");
    optimizer.step();
  }
  wait_for_device(x.device());
  const Clock::time_point t4 = Clock::now();
  result.peak_bytes.push_back(tracker.peak_bytes() - base_bytes);
  if (recorder != nullptr) {
    result.memory_samples = sampler->stop();
    recorder->add_phase("forward", t0, t1);
    recorder->add_phase("loss", t1, t2);
    recorder->add_phase("backward", t2, t3);
    recorder->add_phase("optimizer", t3, t4);
  }
  result.step_ms.push_back(std::chrono::duration<double, std::milli>(t4 - t0).count());
  result.losses.push_back(static_cast<float>(loss_value));
  return loss_value;
}

// After a step: what was live at its peak, kept if the step is the traced one or if its peak is
// the run's highest so far (the warm-up step is left out, as in RunResult::peak).
void keep_peak(RunResult& result, int step, int instrumented_step, const MemoryTracker& tracker,
               const std::vector<torch::Tensor>& parameters,
               const torch::optim::Optimizer& optimizer) {
  StepPeak peak;
  peak.breakdown = tracker.peak_breakdown(parameters, optimizer_state_tensors(optimizer));
  peak.step = step + 1;
  peak.base_bytes = tracker.peak_bytes() - result.peak_bytes.back();
  if (step == instrumented_step) {
    result.traced_breakdown = peak;
    if (result.recorder) result.recorder->set_peak(peak.breakdown.time, peak_json(peak));
  }
  const auto above_start = [](const StepPeak& p) { return p.breakdown.peak_bytes - p.base_bytes; };
  if (!result.peak_breakdown || above_start(peak) > above_start(*result.peak_breakdown)) {
    result.peak_breakdown = std::move(peak);
  }
}

// The GPT every run starts from: seeded, built on the CPU (the same weights on any device), then
// moved to the device.
torch::nn::Sequential seeded_gpt(const TrainArgs& args, const GptConfig& config) {
  torch::manual_seed(args.seed);
  torch::nn::Sequential chain = make_gpt(config);
  chain->to(c10::Device(args.device));
  chain->train();
  return chain;
}

// The forward of a step that reports (--report): its regions record what they keep into `report`.
Forward reporting(const Forward& forward, std::optional<KeptReport>& report) {
  return [&forward, &report](const torch::Tensor& x) {
    report.emplace();
    const ReportScope scope(*report);
    return forward(x);
  };
}

RunResult train_once(const TrainArgs& args, const Corpus& corpus, const Strategy& strategy,
                     const std::string& label, bool instrument, bool report) {
  RunResult result;
  result.label = label;
  // Before the model: the first tracker installs the counting allocator, and the parameters
  // must be its blocks for the peak's breakdown to find them.
  MemoryTracker tracker{c10::Device(args.device)};
  const GptConfig config = gpt_config(args, corpus);
  torch::nn::Sequential chain = seeded_gpt(args, config);
  std::vector<torch::Tensor> parameters = chain->parameters();
  const auto clear_grads = [&] {
    for (torch::Tensor& parameter : parameters) parameter.mutable_grad().reset();
  };
  if (instrument) result.recorder = std::make_unique<StepRecorder>(stage_names(args.layers));
  PlannedSequential planned{nullptr};
  const Forward forward = prepare_strategy(args, corpus, strategy, chain, planned, result);
  const Forward first_forward = report ? reporting(forward, result.kept_report) : forward;

  torch::manual_seed(args.seed + 1);  // dropout draws: the same in every run
  torch::optim::AdamW optimizer(
      parameters,
      torch::optim::AdamWOptions(args.lr).betas(std::make_tuple(0.9, 0.95)).weight_decay(0.1));
  // The breakdown needs the counting allocator's blocks: on the CPU only.
  const bool breakdown = !args.trace_path.empty() && tracker.device().is_cpu();
  if (breakdown) tracker.record_breakdown();
  MemorySampler sampler(c10::Device(args.device));
  std::mt19937_64 rng(args.seed);
  std::vector<int64_t> inputs, targets;
  const int instrumented_step = static_cast<int>(std::min<int64_t>(1, args.steps - 1));
  Progress progress(label, static_cast<int>(args.steps));
  for (int step = 0; step < args.steps; ++step) {
    if (g_interrupted) {
      result.interrupted = true;
      break;
    }
    sample_batch(corpus, args.batch, args.context, rng, inputs, targets);
    clear_grads();
    const bool record = result.recorder && step == instrumented_step;
    const double loss = train_step(step == 0 ? first_forward : forward, to_tensor(inputs, args),
                                   to_tensor(targets, args), config.vocab, optimizer, tracker,
                                   record ? &sampler : nullptr, result);
    if (breakdown && step >= instrumented_step) {
      keep_peak(result, step, instrumented_step, tracker, parameters, optimizer);
    }
    const double seconds = result.step_ms.back() / 1e3;
    progress.update(step + 1, loss, static_cast<double>(args.batch * args.context) / seconds,
                    tracker.current_bytes(), result.peak_bytes.back());
  }
  progress.finish();
  if (result.recorder) set_probe(chain, nullptr);
  if (result.kept_report) {
    std::printf("\nwhat the first step of the %s run keeps for its backward (--report):\n%s",
                label.c_str(), result.kept_report->text().c_str());
    std::fflush(stdout);
  }
  return result;
}

bool identical(const RunResult& a, const RunResult& b, int* compared) {
  const int n = std::min(a.steps(), b.steps());
  *compared = n;
  return n > 0 && std::memcmp(a.losses.data(), b.losses.data(), sizeof(float) * n) == 0;
}

nlohmann::json run_json(const RunResult& run, int instrumented_step) {
  nlohmann::json object = {{"label", run.label},
                           {"peak_bytes", run.peak()},
                           {"step_ms", run.median_ms(instrumented_step)},
                           {"losses", run.losses},
                           {"steps", run.steps()},
                           {"peak_bytes_per_step", run.peak_bytes},
                           {"step_ms_per_step", run.step_ms},
                           {"interrupted", run.interrupted}};
  object["final_loss"] =
      run.losses.empty() ? nlohmann::json(nullptr) : nlohmann::json(run.losses.back());
  if (run.budget_bytes >= 0) {
    object["budget_bytes"] = run.budget_bytes;
    object["predicted_peak_bytes"] = run.predicted_peak_bytes;
    object["forward_count"] = run.forward_count;
    object["schedule"] = run.schedule;
    object["profile"] = run.profile;
  }
  if (run.peak_breakdown) object["peak_breakdown"] = peak_json(*run.peak_breakdown);
  if (run.kept_report) object["kept_report"] = nlohmann::json::parse(run.kept_report->json());
  return object;
}

// What is live at each run's peak (--trace), and how much of the plain run's peak checkpointing
// could lower at all.
void print_peaks(const RunResult& baseline, const RunResult* checkpointed) {
  if (!baseline.peak_breakdown) return;
  std::printf("\nwhat is live at each run's peak (all of the process's CPU memory):\n");
  print_peak(baseline.label, *baseline.peak_breakdown);
  if (checkpointed != nullptr && checkpointed->peak_breakdown) {
    print_peak(checkpointed->label, *checkpointed->peak_breakdown);
  }
  const MemoryBreakdown& plain = baseline.peak_breakdown->breakdown;
  const int64_t activations = activation_bytes(plain);
  std::printf("checkpointing can lower only the activations: %s of the plain peak's %s (%.0f%%)\n",
              format_bytes(activations).c_str(), format_bytes(plain.peak_bytes).c_str(),
              plain.peak_bytes > 0
                  ? 100.0 * static_cast<double>(activations) / static_cast<double>(plain.peak_bytes)
                  : 0.0);
}

void print_summary(const TrainArgs& args, const Strategy& strategy, const RunResult& baseline,
                   const RunResult* checkpointed, int instrumented_step) {
  char line[256];
  std::printf("\n%-22s %14s %14s %12s %8s\n", "run", "peak memory", "median step", "final loss",
              "steps");
  const auto row = [&](const RunResult& run) {
    std::snprintf(line, sizeof line, "%-22s %14s %11.1f ms %12.4f %8d\n", run.label.c_str(),
                  format_bytes(run.peak()).c_str(), run.median_ms(instrumented_step),
                  run.losses.empty() ? 0.0 : static_cast<double>(run.losses.back()), run.steps());
    std::fputs(line, stdout);
  };
  row(baseline);
  if (checkpointed != nullptr) {
    row(*checkpointed);
    const double memory = baseline.peak() > 0 ? static_cast<double>(checkpointed->peak()) /
                                                    static_cast<double>(baseline.peak())
                                              : 0.0;
    const double base_ms = baseline.median_ms(instrumented_step);
    const double time = base_ms > 0 ? checkpointed->median_ms(instrumented_step) / base_ms : 0.0;
    std::printf("%-22s %13.1f%% %13.2fx\n", "checkpointed/baseline", 100 * memory, time);
    if (checkpointed->budget_bytes >= 0) {
      std::printf("\nplanned: budget %s, predicted peak %s, %d stage forwards for %lld stages\n",
                  format_bytes(checkpointed->budget_bytes).c_str(),
                  format_bytes(checkpointed->predicted_peak_bytes).c_str(),
                  checkpointed->forward_count, static_cast<long long>(args.layers + 2));
      std::printf("schedule: %s\n", checkpointed->schedule.c_str());
    }
    int compared = 0;
    const bool same = identical(baseline, *checkpointed, &compared);
    std::printf("\nloss curves: %s (%d steps compared)\n",
                same ? "identical, bit for bit" : "DIFFERENT", compared);
  } else {
    std::printf("\n%s run: not started (interrupted)\n", strategy.text.c_str());
  }
  print_peaks(baseline, checkpointed);
  std::fflush(stdout);
}

// The model and the batches: --model, --layers, --width, --heads, --context, --batch, --steps,
// --threads.
void add_shape_options(CLI::App* command, TrainArgs& args) {
  command
      ->add_option("--model", args.model,
                   "gpt (the character model, a chain) | unet (a U-Net on synthetic images, each "
                   "block a candidate of ckpt::PlannedModel; --strategy none or budget:B)")
      ->check(CLI::IsMember({"gpt", "unet"}))
      ->capture_default_str();
  command->add_option("--layers", args.layers, "Transformer blocks")->capture_default_str();
  command->add_option("--width", args.width, "Embedding width")->capture_default_str();
  command->add_option("--heads", args.heads, "Attention heads (must divide --width)")
      ->capture_default_str();
  command->add_option("--context", args.context, "Context length in characters")
      ->capture_default_str();
  command->add_option("--batch", args.batch, "Sequences per step")->capture_default_str();
  command->add_option("--steps", args.steps, "Training steps of each run")->capture_default_str();
  command->add_option("--threads", args.threads, "Intra-op threads (torch::set_num_threads)")
      ->capture_default_str();
}

// What each run does: --strategy, --seed, --device.
void add_run_options(CLI::App* command, TrainArgs& args) {
  command
      ->add_option("--strategy", args.strategy,
                   "none | sequential:K | selective[:K] (keeps matrix products) | offload[:K] "
                   "(host memory; --device emulated or cuda) | budget:BYTES | budget:PCT% "
                   "(through the planner)")
      ->type_name("NAME")
      ->capture_default_str();
  command->add_option("--storage-modes", args.storage_modes, models::storage_modes_help())
      ->type_name("LIST")
      ->capture_default_str();
  command->add_option("--seed", args.seed, "Seed of the weights, batches and dropout")
      ->check(CLI::Validator(  // "-1" would wrap to 2^64 - 1
          [](const std::string& text) {
            return text.find('-') == std::string::npos ? std::string()
                                                       : "must not be negative, but got " + text;
          },
          "", "non-negative"))
      ->capture_default_str();
  command
      ->add_option("--device", args.device,
                   std::string("Where both runs train: ") + models::kDeviceChoices +
                       " (emulated: ckpt's emulated accelerator, LibTorch 2.9+)")
      ->type_name("DEVICE")
      ->capture_default_str();
}

// How it learns and from what: --lr, --dropout, --untied, --corpus.
void add_training_options(CLI::App* command, TrainArgs& args) {
  command->add_option("--lr", args.lr, "AdamW learning rate")->capture_default_str();
  command->add_option("--dropout", args.dropout, "Dropout probability")->capture_default_str();
  command->add_flag("--untied", args.untied, "Give the head its own weight (default: tied)");
  command
      ->add_option("--corpus", args.corpus,
                   "Training text: a file or folder (default: /usr/share/common-licenses)")
      ->type_name("PATH");
}

// What it writes: --plot, --trace, --json, --chain.
void add_output_options(CLI::App* command, TrainArgs& args) {
  command->add_option("--plot", args.plot_path, "Write the memory-over-one-step chart (SVG)")
      ->type_name("FILE.svg");
  command->add_option("--trace", args.trace_path, "Write a Chrome trace of one step of each run")
      ->type_name("FILE.json");
  command->add_option("--json", args.json_path, "Write the summary as JSON")->type_name("FILE");
  command->add_flag("--report", args.report,
                    "Print what each checkpointed region of the --strategy run keeps for its "
                    "backward, and why (from its first step)");
  command
      ->add_option("--chain", args.chain_path,
                   "Write the model's measured chain (stage times and sizes), the input of "
                   "`ckpt plan --chain`")
      ->type_name("FILE.json");
}

}  // namespace

CLI::App* add_train_command(CLI::App& app, TrainArgs& args) {
  CLI::App* command = app.add_subcommand(
      "train",
      "Train the built-in GPT-style character model twice with the same seeds: without "
      "checkpointing and under --strategy; compare peak memory, step time and losses");
  command->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  // In this order in --help.
  add_shape_options(command, args);
  add_run_options(command, args);
  add_training_options(command, args);
  add_output_options(command, args);
  add_distributed_options(command, args);
  return command;
}

namespace {

void print_header(const TrainArgs& args, const Corpus& corpus, const Strategy& strategy) {
  std::printf(
      "ckpt train: GPT, %lld blocks, width %lld, %lld heads, context %lld, batch %lld, "
      "%lld steps, %lld thread%s, dropout %g, %s head\n",
      static_cast<long long>(args.layers), static_cast<long long>(args.width),
      static_cast<long long>(args.heads), static_cast<long long>(args.context),
      static_cast<long long>(args.batch), static_cast<long long>(args.steps),
      static_cast<long long>(args.threads), args.threads == 1 ? "" : "s", args.dropout,
      args.untied ? "untied" : "tied");
  std::printf("corpus:   %s (%d files, %zu characters, vocabulary %zu)\n", corpus.source.c_str(),
              corpus.file_count, corpus.tokens.size(), corpus.vocabulary.size());
  std::printf("strategy: %s\n", strategy.text.c_str());
  std::printf("device:   %s\n", args.device.c_str());
  std::fflush(stdout);
}

// Peaks are read from the device's allocator statistics (MemoryTracker).
void check_memory_measurable(const c10::Device& device) {
  if (MemoryTracker::can_measure(device)) return;
  throw UsageError("--device " + device.str() +
                   ": LibTorch " TORCH_VERSION
                   " can't measure this device's memory, which ckpt train compares; use "
                   "--device cpu");
}

struct BothRuns {
  RunResult baseline;
  std::optional<RunResult> checkpointed;
  bool interrupted = false;
};

// The plain run and the strategy's. A planned strategy runs first: a budget below the feasible
// minimum fails at once.
BothRuns train_both(const TrainArgs& args, const Corpus& corpus, const Strategy& strategy,
                    bool instrument) {
  BothRuns runs;
  const auto baseline = [&] {
    runs.baseline = train_once(args, corpus, Strategy{}, "no checkpoint", instrument, false);
    runs.interrupted = runs.interrupted || runs.baseline.interrupted;
  };
  const auto checkpointed = [&] {
    runs.checkpointed = train_once(args, corpus, strategy, strategy.text, instrument, args.report);
    runs.interrupted = runs.interrupted || runs.checkpointed->interrupted;
  };
  const bool planned_first = strategy.kind == Strategy::Kind::Budget;
  planned_first ? checkpointed() : baseline();
  if (!runs.interrupted) planned_first ? baseline() : checkpointed();
  if (runs.baseline.label.empty()) runs.baseline.label = "no checkpoint";
  return runs;
}

void write_json(const TrainArgs& args, const Corpus& corpus, const Strategy& strategy,
                const BothRuns& runs, int instrumented_step) {
  nlohmann::json config = config_json(args);
  config["corpus"] = corpus.source;
  config["vocabulary"] = corpus.vocabulary.size();
  nlohmann::json document = {{"strategy", strategy.text},
                             {"config", config},
                             {"baseline", run_json(runs.baseline, instrumented_step)},
                             {"interrupted", runs.interrupted}};
  document["checkpointed"] = nullptr;
  if (runs.checkpointed) {
    const RunResult& baseline = runs.baseline;
    const RunResult& checkpointed = *runs.checkpointed;
    int compared = 0;
    document["checkpointed"] = run_json(checkpointed, instrumented_step);
    document["identical_losses"] = identical(baseline, checkpointed, &compared);
    document["peak_ratio"] = baseline.peak() > 0 ? static_cast<double>(checkpointed.peak()) /
                                                       static_cast<double>(baseline.peak())
                                                 : 0.0;
    const double base_ms = baseline.median_ms(instrumented_step);
    document["step_time_ratio"] =
        base_ms > 0 ? checkpointed.median_ms(instrumented_step) / base_ms : 0.0;
  }
  write_whole_file(args.json_path, document.dump(2) + "\n", "--json");
}

void write_plot(const TrainArgs& args, const Strategy& strategy, const BothRuns& runs) {
  std::vector<MemorySeries> series{{"no checkpoint", "#d62728", runs.baseline.memory_samples}};
  if (runs.checkpointed) {
    series.push_back({strategy.text, "#1f77b4", runs.checkpointed->memory_samples});
  }
  char title[256];
  std::snprintf(title, sizeof title,
                "Memory during one training step: GPT %lld blocks, width %lld, batch %lld x %lld",
                static_cast<long long>(args.layers), static_cast<long long>(args.width),
                static_cast<long long>(args.batch), static_cast<long long>(args.context));
  write_memory_plot(args.plot_path, series, title);
  std::printf("plot:  %s\n", args.plot_path.c_str());
}

void write_trace(const TrainArgs& args, const Strategy& strategy, const BothRuns& runs) {
  ChromeTrace trace;
  if (runs.baseline.recorder) {
    runs.baseline.recorder->write_to(trace, 1, "no checkpoint", runs.baseline.memory_samples);
  }
  if (runs.checkpointed && runs.checkpointed->recorder) {
    runs.checkpointed->recorder->write_to(trace, 2, strategy.text,
                                          runs.checkpointed->memory_samples);
  }
  trace.write(args.trace_path);
  std::printf("trace: %s\n", args.trace_path.c_str());
}

}  // namespace

int run_train(const TrainArgs& given) {
  TrainArgs args = given;
  const c10::Device device = parse_device_option(args);
  if (wants_distributed(args)) {
    if (args.report) {
      throw UsageError(
          "--report prints what a single-process run keeps; leave out --ranks, --rank and "
          "--world-size (or the torchrun environment), or --report");
    }
    if (args.model != "gpt") {
      throw UsageError("--model " + args.model +
                       ": data-parallel training (--ranks, --rank or the torchrun environment) "
                       "trains the GPT; leave --model out");
    }
    if (!device.is_cpu()) {
      throw UsageError("--device " + args.device +
                       ": data-parallel training (--ranks, --rank or the torchrun environment) "
                       "runs on the CPU only; leave --device out");
    }
    return run_train_distributed(args);
  }
  check_memory_measurable(device);
  args.device = device.str();  // "cuda" -> "cuda:0", as the runs create their tensors
  if (args.model == "unet") return run_train_unet(args, device);
  validate_train_args(args, MachineLimits::of_this_machine());
  const Strategy strategy = parse_strategy(args);
  torch::set_num_threads(static_cast<int>(args.threads));
  const Corpus corpus = load_corpus(args.corpus, args.context + 2);
  print_header(args, corpus, strategy);

  SigintGuard sigint;
  const bool instrument = !args.plot_path.empty() || !args.trace_path.empty();
  const int instrumented_step = static_cast<int>(std::min<int64_t>(1, args.steps - 1));
  const BothRuns runs = train_both(args, corpus, strategy, instrument);
  if (runs.interrupted) {
    std::fprintf(stderr, "ckpt: interrupted; summary of the steps run so far\n");
  }
  print_summary(args, strategy, runs.baseline, runs.checkpointed ? &*runs.checkpointed : nullptr,
                instrumented_step);
  if (!args.json_path.empty()) write_json(args, corpus, strategy, runs, instrumented_step);
  if (!args.plot_path.empty()) write_plot(args, strategy, runs);
  if (!args.trace_path.empty()) write_trace(args, strategy, runs);
  if (!args.json_path.empty()) std::printf("json:  %s\n", args.json_path.c_str());
  return runs.interrupted ? kExitInterrupted : kExitOk;
}

StrategyForward strategy_forward(const TrainArgs& args, const Corpus& corpus,
                                 torch::nn::Sequential& chain) {
  struct Prepared {
    PlannedSequential planned{nullptr};
    RunResult result;
    Forward forward;
  };
  const Strategy strategy = parse_strategy(args);
  auto prepared = std::make_shared<Prepared>();
  prepared->result.label = strategy.text;
  prepared->forward =
      prepare_strategy(args, corpus, strategy, chain, prepared->planned, prepared->result);
  return {[prepared](const torch::Tensor& x) { return prepared->forward(x); }, strategy.text};
}

}  // namespace cli
}  // namespace ckpt
