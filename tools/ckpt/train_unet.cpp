#include "train_unet.h"

#include "errors.h"
#include "marked_models.h"
#include "output_path.h"
#include "statistics.h"

#include <ckpt/memory_tracker.h>
#include <ckpt/planned_model.h>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

namespace ckpt {
namespace cli {
namespace {

using Clock = std::chrono::steady_clock;

struct UnetRun {
  std::vector<double> losses;
  std::vector<double> step_seconds;  // forward, backward and the optimizer's step
  int64_t peak_bytes = 0;  // the largest forward and backward's, above what lived before it
};

// The budget of `--strategy budget:B`, or none for `--strategy none`.
std::optional<Budget> unet_budget(const std::string& strategy) {
  if (strategy == "none") return std::nullopt;
  const std::string prefix = "budget:";
  if (strategy.rfind(prefix, 0) == 0) {
    try {
      return Budget::parse(strategy.substr(prefix.size()));
    } catch (const std::invalid_argument& e) {
      throw UsageError("--strategy " + strategy + ": " + e.what());
    }
  }
  throw UsageError("--strategy " + strategy +
                   ": --model unet runs none or budget:B (ckpt::PlannedModel chooses each "
                   "block's storage mode within B: bytes, a percentage, or min)");
}

// A synthetic segmentation batch: the class of each pixel is whether its channels sum above 0.
std::pair<torch::Tensor, torch::Tensor> unet_batch(const models::UNetConfig& config, uint64_t seed,
                                                   int64_t step, c10::Device device) {
  torch::manual_seed(seed + static_cast<uint64_t>(step));
  torch::Tensor x = torch::randn({config.batch, config.in_channels, config.image, config.image});
  torch::Tensor classes = (x.sum(1) > 0).to(torch::kLong);
  return {x.to(device), classes.to(device)};
}

UnetRun train_unet(const TrainArgs& args, const models::UNetConfig& config, c10::Device device,
                   const std::optional<Budget>& budget, std::optional<PlannedModel>& planned) {
  models::UNet model = models::make_unet(config);
  model->to(device);
  if (budget) planned.emplace(model, *budget);
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(args.lr));
  MemoryTracker tracker(device);
  UnetRun run;
  for (int64_t step = 0; step < args.steps; ++step) {
    const auto [x, classes] = unet_batch(config, args.seed, step, device);
    const auto loss_fn = [&] { return torch::cross_entropy_loss(model->forward(x), classes); };
    optimizer.zero_grad();
    if (planned && !planned->planned()) {  // outside the measured step
      try {
        planned->plan(loss_fn);
      } catch (const InfeasibleBudget& error) {  // a usage error, as with --model gpt
        throw UsageError("--strategy " + args.strategy + ": " + error.what_without_backtrace());
      }
    }
    tracker.reset_peak();
    const int64_t before = tracker.current_bytes();
    const auto start = Clock::now();
    torch::Tensor loss = planned ? planned->run(loss_fn) : loss_fn();
    loss.backward();
    run.peak_bytes = std::max(run.peak_bytes, tracker.peak_bytes() - before);
    optimizer.step();
    run.step_seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    run.losses.push_back(loss.item<double>());
  }
  return run;
}

// The median step time after the first (which creates the optimizer's state).
double median_steady_seconds(const UnetRun& run) {
  std::vector<double> steady(run.step_seconds.begin() + (run.step_seconds.size() > 1 ? 1 : 0),
                             run.step_seconds.end());
  return models::median(steady);
}

nlohmann::json run_json(const UnetRun& run) {
  return {{"losses", run.losses},
          {"peak_bytes", run.peak_bytes},
          {"median_step_seconds", median_steady_seconds(run)}};
}

void print_run(const char* label, const UnetRun& run) {
  std::printf("%-12s peak %8.2f MiB   step %7.1f ms (median after the first)   final loss %.6f\n",
              label, static_cast<double>(run.peak_bytes) / (1024.0 * 1024.0),
              median_steady_seconds(run) * 1e3, run.losses.empty() ? 0.0 : run.losses.back());
}

}  // namespace

int run_train_unet(const TrainArgs& args, c10::Device device) {
  const std::optional<Budget> budget = unet_budget(args.strategy);
  for (const auto& [given, option] : {std::pair{!args.plot_path.empty(), "--plot"},
                                      {!args.trace_path.empty(), "--trace"},
                                      {!args.chain_path.empty(), "--chain"},
                                      {args.report, "--report"}}) {
    if (given) throw UsageError(std::string(option) + " is for --model gpt; leave it out");
  }
  validate_threads(args.threads, MachineLimits::of_this_machine(), "--threads");
  check_output_path(args.json_path, "--json");
  // A batch of 128x128 images needs about 20 MiB a sample to train: 1024 is past any machine's.
  if (args.steps < 1 || args.steps > 1'000'000) {
    throw UsageError("--steps must be in [1, 1000000], but got " + std::to_string(args.steps));
  }
  if (args.batch < 1 || args.batch > 1024) {
    throw UsageError("--batch must be in [1, 1024] for --model unet, but got " +
                     std::to_string(args.batch));
  }
  models::UNetConfig config = models::unet_config(/*quick=*/false);
  config.batch = args.batch;
  torch::set_num_threads(static_cast<int>(args.threads));
  std::printf("ckpt train: %s, %lld steps, on %s, strategy %s\n", models::describe(config).c_str(),
              static_cast<long long>(args.steps), device.str().c_str(), args.strategy.c_str());
  std::optional<PlannedModel> none;
  const UnetRun plain = train_unet(args, config, device, std::nullopt, none);
  print_run("none", plain);
  nlohmann::json document = {{"model", "unet"},
                             {"strategy", args.strategy},
                             {"steps", args.steps},
                             {"baseline", run_json(plain)},
                             {"checkpointed", nullptr}};
  if (budget) {
    std::optional<PlannedModel> planned;
    const UnetRun run = train_unet(args, config, device, budget, planned);
    print_run(args.strategy.c_str(), run);
    const bool identical = run.losses == plain.losses;
    std::printf("losses identical to the plain run's: %s (%zu steps)\n%s", identical ? "yes" : "NO",
                run.losses.size(), planned->summary().c_str());
    document["checkpointed"] = run_json(run);
    document["identical_losses"] = identical;
    document["budget_bytes"] = planned->budget_bytes();
    document["plain_peak_bytes"] = planned->plain_peak_bytes();
    document["predicted_peak_bytes"] = planned->solution().prediction.peak_bytes;
    document["peak_ratio"] = static_cast<double>(run.peak_bytes) / plain.peak_bytes;
    document["step_time_ratio"] = median_steady_seconds(run) / median_steady_seconds(plain);
  }
  if (!args.json_path.empty()) {
    write_whole_file(args.json_path, document.dump(2) + "\n", "--json");
    std::printf("json:  %s\n", args.json_path.c_str());
  }
  return kExitOk;
}

}  // namespace cli
}  // namespace ckpt
