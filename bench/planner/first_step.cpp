// What planning costs: the first step of a PlannedSequential (profiling, solving, then the step)
// against a plain training step of the same chain, in time and in peak memory, for the bench
// models and ckpt train's GPT (issue 29, item 3); then the first step of a PlannedModel on the
// bench models whose blocks mark candidates and on the bench U-Net, with the "recomputed" chains
// measured as the budget needs them (the default) and every option measured. Peaks come from the
// counting allocator, above what lived before the step; every step starts without parameter
// gradients (zero_grad()).
//
//   first_step [--quick] [--budget 50%] [--measure-every-stage]

#include <ckpt/memory_tracker.h>
#include <ckpt/planned_model.h>
#include <ckpt/planned_sequential.h>
#include <ckpt/profiler.h>

#include "bench_models.h"
#include "gpt.h"
#include "marked_models.h"

#include <ATen/ops/randint.h>
#include <torch/nn/module.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

struct Measured {
  double seconds = 0;
  int64_t peak = 0;
};

Measured measure(torch::nn::Module& model, const std::function<at::Tensor()>& step) {
  for (auto& p : model.parameters()) p.mutable_grad().reset();
  ckpt::MemoryTracker tracker;
  tracker.reset_peak();
  const int64_t before = tracker.current_bytes();
  const auto start = Clock::now();
  step().backward();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return {seconds, tracker.peak_bytes() - before};
}

void report(const std::string& name, torch::nn::Sequential chain, const at::Tensor& input,
            const std::string& budget, const ckpt::ProfileOptions& profiling_options) {
  const auto loss = [](const at::Tensor& y) { return y.to(at::kFloat).pow(2).mean(); };
  Measured plain;
  for (int i = 0; i < 3; ++i) {  // the last of three: allocator and caches warm
    plain = measure(*chain, [&] { return loss(chain->forward(input)); });
  }
  std::vector<torch::nn::AnyModule> stages;
  for (const auto& stage : *chain) stages.push_back(stage);
  const Measured profiling = measure(*chain, [&] {
    ckpt::profile_chain(stages, input, profiling_options);
    return at::zeros({1}).requires_grad_().sum();
  });
  ckpt::PlannedSequential planned(
      chain, ckpt::Budget::parse(budget),
      ckpt::PlannedSequentialOptions().fall_back_to_minimum(true).profiler(
          std::make_shared<ckpt::MeasuringProfiler>(profiling_options)));
  const Measured first = measure(*planned, [&] { return loss(planned(input)); });
  const Measured second = measure(*planned, [&] { return loss(planned(input)); });
  std::printf(
      "| %s | %.3f s | %.1f MiB | %.1fx | %.2fx | %.3f s (%.1fx) | %.1f MiB (%.2fx) | %.2fx |\n",
      name.c_str(), plain.seconds, plain.peak / 1048576.0, profiling.seconds / plain.seconds,
      static_cast<double>(profiling.peak) / static_cast<double>(plain.peak), first.seconds,
      first.seconds / plain.seconds, first.peak / 1048576.0,
      static_cast<double>(first.peak) / static_cast<double>(plain.peak),
      static_cast<double>(second.peak) / static_cast<double>(plain.peak));
}

// A PlannedModel's first step, measuring as needed (`as_needed`) or every option, against a
// plain step of the same model.
void report_model(const std::string& name, const std::shared_ptr<torch::nn::Module>& model,
                  const std::function<at::Tensor()>& loss, const std::string& budget) {
  Measured plain;
  for (int i = 0; i < 3; ++i) plain = measure(*model, loss);
  std::printf("| %s | %.3f s | %.1f MiB |", name.c_str(), plain.seconds, plain.peak / 1048576.0);
  for (const bool as_needed : {true, false}) {
    ckpt::PlannedModel planned(model, ckpt::Budget::parse(budget),
                               ckpt::PlannedModelOptions().measure_as_needed(as_needed));
    const Measured first = measure(*model, [&] { return planned.run(loss); });
    int longest = 0;  // the longest "recomputed" chain the plan could choose from
    for (const auto& candidate : planned.measured().profile.candidates) {
      for (const auto& option : candidate.options) {
        if (option.run.outputs_recomputed) longest = std::max(longest, option.run.chain_length);
      }
    }
    std::printf(" %.2f s (%.1fx), peak %.2fx, chains to %d, plan %.2fx |", first.seconds,
                first.seconds / plain.seconds,
                static_cast<double>(first.peak) / static_cast<double>(plain.peak), longest,
                planned.solution().prediction.time / planned.measured().profile.step_time);
  }
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  std::string budget = "50%";
  CLI::App app{
      "The first step of a PlannedSequential (profiling and solving) against a plain step"};
  bool every_stage = false;
  app.add_flag("--quick", quick, "small models (a smoke test)");
  app.add_flag(
      "--measure-every-stage", every_stage,
      "measure every stage, repeated ones too (ProfileOptions::reuse_repeated_stages off)");
  app.add_option("--budget", budget,
                 "the plans' budget: bytes (\"512MiB\"), a share (\"50%\"), min")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  const auto options = ckpt::ProfileOptions().reuse_repeated_stages(!every_stage);
  std::printf("budget %s, %s\n\n", budget.c_str(),
              every_stage ? "every stage measured" : "repeated stages measured once");
  std::printf(
      "| model | plain step | plain peak | profile_chain's time | its peak | first planned step | "
      "its peak | next step's peak |\n|---|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const char* name : {"mlp", "resnet", "transformer"}) {
    const auto config = ckpt::models::model_config(name, quick);
    report(name, ckpt::models::build_model(config), ckpt::models::make_input(config), budget,
           options);
  }
  ckpt::models::GptConfig gpt;  // ckpt train's defaults
  gpt.vocab = 65;
  gpt.layers = quick ? 2 : 8;
  torch::manual_seed(0);
  report("gpt (ckpt train)", ckpt::models::make_gpt(gpt),
         at::randint(gpt.vocab, {8, gpt.context}, at::kLong), budget, options);

  std::printf(
      "\n| PlannedModel | plain step | plain peak | first step, chains measured as needed | "
      "every option measured |\n|---|---:|---:|---|---|\n");
  for (const char* name : {"resnet", "transformer"}) {
    const auto config = ckpt::models::model_config(name, quick);
    auto chain = ckpt::models::build_model(config);
    ckpt::models::mark_residual_blocks(chain);
    report_model(
        name, chain.ptr(),
        [chain, x = ckpt::models::make_input(config)]() mutable {
          return chain->forward(x).pow(2).mean();
        },
        budget);
  }
  const auto unet_config = ckpt::models::unet_config(quick);
  auto unet = ckpt::models::make_unet(unet_config);
  report_model(
      "unet", unet.ptr(),
      [unet, x = ckpt::models::unet_input(unet_config)]() mutable {
        return unet->forward(x).pow(2).mean();
      },
      budget);
  return 0;
}
