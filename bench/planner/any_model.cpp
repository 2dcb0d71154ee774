// Planning any model (issue 32): ckpt::PlannedModel on models whose forward marks candidates, at
// budgets of 30%, 50% and 70% of the plain step's peak and at the smallest feasible one, beside the
// plain step and, for the chains, the chain planner's smallest feasible budget
// (ckpt::PlannedSequential, rotor's dynamic program). Each model is profiled once; every budget is
// planned from that profile and run for real: the measured peak (counting allocator, above what
// lived before the step, the step starting without parameter gradients) against the prediction,
// and the step's time against the plain step's (median of --repeats steps). Then hand-placed
// regions (every candidate checkpointed, every other one, the first half, the second half) against
// the plan at each one's measured peak.
//
//   any_model [--quick] [--repeats N] [--models unet,seq2seq,resnet,transformer] [--chains L]

#include <ckpt/candidate.h>
#include <ckpt/memory_tracker.h>
#include <ckpt/planned_model.h>
#include <ckpt/planned_sequential.h>

#include "bench_models.h"
#include "marked_models.h"

#include <torch/nn/module.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
using LossFn = std::function<at::Tensor()>;

struct Step {
  double seconds = 0;
  int64_t peak_bytes = 0;
};

// Median time and largest peak of `repeats` steps after an untimed one, each from no parameter
// gradients.
Step measure(torch::nn::Module& model, const LossFn& step, int repeats) {
  std::vector<double> times;
  Step result;
  ckpt::MemoryTracker tracker(torch::kCPU, ckpt::MemoryScope::CallingThread);
  for (int r = -1; r < repeats; ++r) {
    for (auto& p : model.parameters()) p.mutable_grad().reset();
    tracker.reset_peak();
    const int64_t before = tracker.current_bytes();
    const auto start = Clock::now();
    step().backward();
    if (r < 0) continue;
    times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    result.peak_bytes = std::max(result.peak_bytes, tracker.peak_bytes() - before);
  }
  std::sort(times.begin(), times.end());
  result.seconds = times[times.size() / 2];
  return result;
}

struct Subject {
  std::string name;
  std::string description;
  std::shared_ptr<torch::nn::Module> model;
  LossFn loss;
  torch::nn::Sequential chain{nullptr};  // for the chain planner's comparison, where it is one
  at::Tensor chain_input;
};

double mib(int64_t bytes) {
  return static_cast<double>(bytes) / (1024.0 * 1024.0);
}

// The chain planner's smallest feasible budget, as a fraction of its measured plain peak.
double chain_planner_minimum(const Subject& s) {
  ckpt::PlannedSequential planned(s.chain, ckpt::Budget::minimum());
  planned->plan(s.chain_input);
  return static_cast<double>(planned->budget_bytes()) /
         static_cast<double>(planned->no_checkpoint_peak_bytes());
}

void run_budget(const Subject& s, const ckpt::MeasuredModel& measured, const Step& plain,
                const std::string& budget, int repeats) {
  ckpt::PlannedModel planned(s.model, ckpt::Budget::parse(budget));
  try {
    planned.plan(measured);
  } catch (const ckpt::InfeasibleBudget& e) {
    std::printf("| %s | %s | infeasible (smallest %.1f%%) | | | |\n", s.name.c_str(),
                budget.c_str(),
                100.0 * static_cast<double>(e.smallest_feasible_bytes()) /
                    static_cast<double>(measured.profile.plain_peak_bytes()));
    return;
  }
  const Step step = measure(
      *s.model, [&] { return planned.run(s.loss); }, repeats);
  const int64_t predicted = planned.solution().prediction.peak_bytes;
  std::fprintf(stderr, "%s at %s: exact %d, proven within %g of the fastest\n", s.name.c_str(),
               budget.c_str(), planned.solution().exact ? 1 : 0, planned.solution().gap);
  std::printf("| %s | %s (%.1f%%) | %.2f MiB | %.2f MiB (%+.2f%%) | %s | %.2fx |\n", s.name.c_str(),
              budget.c_str(), 100.0 * planned.budget_bytes() / planned.plain_peak_bytes(),
              mib(step.peak_bytes), mib(predicted),
              100.0 * static_cast<double>(step.peak_bytes - predicted) / predicted,
              step.peak_bytes <= planned.budget_bytes() ? "yes" : "NO",
              step.seconds / plain.seconds);
}

// Hand-placed regions: the candidates `place` picks (by their index in the forward, of `count`)
// run as checkpointed regions, the others plainly, as a user who wraps those blocks in
// ckpt::checkpoint would have them.
class HandPlaced final : public ckpt::detail::CandidateRunner {
 public:
  HandPlaced(std::function<bool(int, int)> place, int count)
      : place_(std::move(place)), count_(count) {}
  std::optional<ckpt::CheckpointOptions> begin(const std::string& /*name*/,
                                               const torch::nn::Module* /*module*/,
                                               std::vector<at::Tensor>& /*inputs*/,
                                               ckpt::detail::RegionRequest& /*request*/) override {
    if (place_(next_++, count_)) return ckpt::CheckpointOptions();
    return std::nullopt;
  }
  void end(std::vector<at::Tensor>& /*outputs*/,
           const ckpt::detail::RegionRequest& /*request*/) override {}
  void abandon() noexcept override {}

 private:
  std::function<bool(int, int)> place_;
  int count_;
  int next_ = 0;
};

struct Placement {
  const char* name;
  std::function<bool(int, int)> place;
};

// Each placement against the plan at the placement's measured peak: is the plan as fast?
void run_hand_placed(const Subject& s, const ckpt::MeasuredModel& measured, const Step& plain,
                     int repeats) {
  const int count = static_cast<int>(measured.candidates.size());
  const std::vector<Placement> placements{
      {"every candidate", [](int, int) { return true; }},
      {"every other one", [](int i, int) { return i % 2 == 0; }},
      {"the first half", [](int i, int n) { return i < n / 2; }},
      {"the second half", [](int i, int n) { return i >= n / 2; }},
  };
  for (const Placement& placement : placements) {
    const Step hand = measure(
        *s.model,
        [&] {
          HandPlaced runner(placement.place, count);
          const ckpt::detail::CandidateRunnerScope scope(&runner);
          return s.loss();
        },
        repeats);
    ckpt::PlannedModel planned(s.model, ckpt::Budget::bytes(hand.peak_bytes));
    std::string plan_cells = "infeasible at that peak | ";
    try {
      planned.plan(measured);
      const Step step = measure(
          *s.model, [&] { return planned.run(s.loss); }, repeats);
      char cells[96];
      std::snprintf(cells, sizeof cells, "%.2f MiB | %.2fx", mib(step.peak_bytes),
                    step.seconds / hand.seconds);
      plan_cells = cells;
    } catch (const ckpt::InfeasibleBudget&) {
    }
    std::printf("| %s | %s | %.2f MiB | %.2fx | %s |\n", s.name.c_str(), placement.name,
                mib(hand.peak_bytes), hand.seconds / plain.seconds, plan_cells.c_str());
  }
}

void run_subject(const Subject& s, int repeats, int chains) {
  std::fprintf(stderr, "%s: %s\n", s.name.c_str(), s.description.c_str());
  const Step plain = measure(*s.model, s.loss, repeats);
  const auto start = std::chrono::steady_clock::now();
  const ckpt::MeasuredModel measured =
      ckpt::profile_model(s.model, s.loss, ckpt::ModelProfileOptions().max_recompute_chain(chains));
  std::fprintf(stderr, "%s: profiled in %.2f s (recompute chains up to %d)\n", s.name.c_str(),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
               chains);
  std::printf(
      "\n| model | budget | measured peak | predicted (measured vs) | within budget | "
      "step time vs plain |\n|---|---|---|---|---|---|\n");
  std::printf("| %s | plain | %.2f MiB | | | 1.00x (%.0f ms) |\n", s.name.c_str(),
              mib(plain.peak_bytes), plain.seconds * 1e3);
  for (const std::string budget : {"70%", "50%", "30%", "min"}) {
    run_budget(s, measured, plain, budget, repeats);
  }
  if (s.chain) {
    std::printf("| %s | chain planner's smallest | %.1f%% of its plain peak | | | |\n",
                s.name.c_str(), 100.0 * chain_planner_minimum(s));
  }
  std::printf(
      "\n| model | hand-placed checkpointed regions | their peak | their time vs plain | "
      "plan at that peak: its peak | plan's time vs the regions' |\n|---|---|---|---|---|---|\n");
  run_hand_placed(s, measured, plain, repeats);
}

Subject bench_model(const std::string& name, bool quick) {
  const auto config = ckpt::models::model_config(name, quick);
  Subject s;
  s.name = name;
  s.description = config.description;
  s.chain = ckpt::models::build_model(config);
  s.model = s.chain.ptr();
  s.chain_input = ckpt::models::make_input(config);
  s.loss = [chain = s.chain, input = s.chain_input]() mutable {
    return chain->forward(input).pow(2).mean();
  };
  return s;
}

std::vector<Subject> subjects(bool quick) {
  std::vector<Subject> all;
  const auto unet_config = ckpt::models::unet_config(quick);
  auto unet = ckpt::models::make_unet(unet_config);
  Subject u;
  u.name = "unet";
  u.description = ckpt::models::describe(unet_config);
  u.model = unet.ptr();
  u.loss = [unet, x = ckpt::models::unet_input(unet_config)]() mutable {
    return unet->forward(x).pow(2).mean();
  };
  all.push_back(u);
  const auto seq_config = ckpt::models::seq2seq_config(quick);
  auto seq2seq = ckpt::models::make_seq2seq(seq_config);
  const auto [source, target] = ckpt::models::seq2seq_inputs(seq_config);
  Subject t;
  t.name = "seq2seq";
  t.description = ckpt::models::describe(seq_config);
  t.model = seq2seq.ptr();
  t.loss = [seq2seq, source = source, target = target]() mutable {
    return seq2seq->forward(source, target).pow(2).mean();
  };
  all.push_back(t);
  all.push_back(bench_model("resnet", quick));
  all.push_back(bench_model("transformer", quick));
  return all;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  int repeats = 3;
  int chains = ckpt::ModelProfileOptions().max_recompute_chain();
  std::string models = "unet,seq2seq,resnet,transformer";
  CLI::App app{"ckpt::PlannedModel on models that are not chains, against the plain step"};
  app.add_flag("--quick", quick, "small models (a smoke test)");
  app.add_option("--repeats", repeats, "timed steps per plan (median)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--models", models, "comma-separated: unet, seq2seq, resnet, transformer")
      ->capture_default_str();
  app.add_option("--chains", chains, "the longest chain of recomputed candidates to measure")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  for (const Subject& s : subjects(quick)) {
    if (("," + models + ",").find("," + s.name + ",") != std::string::npos) {
      run_subject(s, repeats, chains);
    }
  }
  return 0;
}
