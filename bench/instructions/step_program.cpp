// One bench model trained for a number of steps by one method, nothing else: the program that
// bench/instructions/count.py runs under callgrind twice (two step counts), so that start-up,
// model building and planning cancel and the difference is the instructions of the steps alone.
//
// usage: step_program MODEL METHOD STEPS [--quick]   (parsed by CLI11, as the `ckpt` program is)
//   MODEL   mlp, resnet, transformer or small (ckpt bench's models), or small_gelu
//   METHOD  a strategy of `ckpt train --strategy` (models/strategy.h): none | sequential:K |
//           sequential_reentrant:K | selective:K (K segments under save_matmuls()) | budget:B;
//           planned:BUDGET (e.g. planned:100%), the same as budget:BUDGET; intercepted:K (K
//           segments under a policy that keeps nothing: the dispatch modes' interception alone;
//           prints how many operator calls the policy saw); checked:K (K segments, each
//           recompute checked by value); checked_selective:K (selective:K, each recompute
//           checked by value); surviving:BUDGET (planned:BUDGET with
//           OutOfMemory::Replan). Prefixed with penalty: (for example
//           penalty:sequential:16), each step is a gradient-penalty step instead: the input's
//           gradient with create_graph, then one backward of the loss plus the gradient's squared
//           norm; with grouped_penalty: both passes run in one ckpt::GraphExecGroup. Prefixed
//           with resilient: (resilient:sequential:8), each step runs in ckpt::resilient_step.

#include "bench_models.h"
#include "strategy.h"

#include <ckpt/graph_exec_group.h>
#include <ckpt/planned_sequential.h>
#include <ckpt/profiler.h>
#include <ckpt/resilient_step.h>
#include <ckpt/sequential.h>

#include <torch/torch.h>
#include <CLI/CLI.hpp>

#include <functional>
#include <iostream>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

namespace {

using Forward = std::function<torch::Tensor(const torch::Tensor&)>;

int64_t g_policy_calls = 0;  // operator calls the "intercepted" method's policy saw

// The methods are the strategies of `ckpt train --strategy` (models/strategy.h), plus five
// spellings of this program's own: planned:BUDGET (budget:BUDGET, planned with a profiler fit for
// callgrind), surviving:BUDGET (the same with OutOfMemory::Replan), intercepted:K (selective:K
// under a policy that keeps nothing), checked:K (sequential:K with
// CheckpointOptions::check_values) and checked_selective:K (selective:K with it).
Forward method_forward(const std::string& method, torch::nn::Sequential model,
                       const torch::Tensor& sample) {
  const bool intercepted = method.rfind("intercepted:", 0) == 0;
  const bool checked_selective = method.rfind("checked_selective:", 0) == 0;
  const bool checked = checked_selective || method.rfind("checked:", 0) == 0;
  std::string text = method;
  if (intercepted) text = "selective:" + method.substr(std::string("intercepted:").size());
  if (checked)
    text = (checked_selective ? "selective:" : "sequential:") + method.substr(method.find(':') + 1);
  const bool surviving = method.rfind("surviving:", 0) == 0;
  if (method.rfind("planned:", 0) == 0)
    text = "budget:" + method.substr(std::string("planned:").size());
  if (surviving) text = "budget:" + method.substr(std::string("surviving:").size());
  const auto strategy = ckpt::models::parse_strategy(text, static_cast<int64_t>(model->size()));
  if (strategy.kind == ckpt::models::Strategy::Kind::Budget) {
    // One repeat per measurement: under callgrind every profiled step is slow, and the plan at
    // the budgets counted here (the plain peak) does not depend on the times.
    const auto profiler = std::make_shared<ckpt::MeasuringProfiler>(
        ckpt::ProfileOptions().repeats(1).warmup(0).calibrate_to_step(false));
    ckpt::PlannedSequential planned(
        model, strategy.budget,
        ckpt::PlannedSequentialOptions().profiler(profiler).on_out_of_memory(
            surviving ? ckpt::OutOfMemory::Replan : ckpt::OutOfMemory::Raise));
    planned->plan(sample);
    std::cerr << "schedule: " << ckpt::plan::to_string(planned->schedule()) << "\n";
    return [planned](const torch::Tensor& x) mutable { return planned->forward(x); };
  }
  if (!intercepted && !checked) return ckpt::models::chain_forward(strategy, model);
  auto options = ckpt::models::checkpoint_options(strategy);
  if (checked) {
    options.check_values(true);
  } else {
    options.policy(ckpt::SelectivePolicy([](const ckpt::OpCall&) {
      ++g_policy_calls;
      return ckpt::CheckpointPolicy::PreferRecompute;
    }));
  }
  return [=](const torch::Tensor& x) {
    return ckpt::checkpoint_sequential(model, strategy.segments, x, options);
  };
}

}  // namespace

// The step: forward, mean of squares, backward; or the gradient-penalty step.
enum class Step { Plain, Penalty, GroupedPenalty };

Step step_kind(std::string& method) {
  for (const auto& [prefix, kind] :
       {std::pair<std::string, Step>{"penalty:", Step::Penalty},
        std::pair<std::string, Step>{"grouped_penalty:", Step::GroupedPenalty}}) {
    if (method.rfind(prefix, 0) != 0) continue;
    method = method.substr(prefix.size());
    return kind;
  }
  return Step::Plain;
}

void run_step(Step kind, const Forward& forward, const torch::Tensor& x) {
  if (kind == Step::Plain) {
    forward(x).square().mean().backward();
    return;
  }
  std::optional<ckpt::GraphExecGroup> group;
  if (kind == Step::GroupedPenalty) group.emplace();
  const torch::Tensor loss = forward(x).square().mean();
  const torch::Tensor gradient = torch::autograd::grad({loss}, {x}, {}, true, true)[0];
  (loss + gradient.square().sum()).backward();
}

int main(int argc, char** argv) try {
  std::string model_name, method;
  int steps = 0;
  bool quick = false;
  CLI::App app{
      "One bench model trained by one method, for counting instructions per step "
      "(bench/instructions/count.py)",
      "step_program"};
  app.add_option("model", model_name, "mlp, resnet, transformer, small or small_gelu")
      ->required()
      ->check(CLI::IsMember({"mlp", "resnet", "transformer", "small", "small_gelu"}));
  app.add_option("method", method,
                 "a strategy of `ckpt train --strategy`, planned:BUDGET, surviving:BUDGET, "
                 "intercepted:K or checked:K, "
                 "optionally prefixed with penalty: or grouped_penalty:, and with resilient:")
      ->required();
  app.add_option("steps", steps, "training steps")->required()->check(CLI::PositiveNumber);
  app.add_flag("--quick", quick, "the small sizes of `ckpt bench --quick`");
  CLI11_PARSE(app, argc, argv);
  const std::string resilient_prefix = "resilient:";
  const bool resilient = method.rfind(resilient_prefix, 0) == 0;
  if (resilient) method = method.substr(resilient_prefix.size());
  torch::set_num_threads(1);
  const auto config = ckpt::models::model_config(model_name, quick);
  torch::nn::Sequential model = ckpt::models::build_model(config);
  const torch::Tensor x = ckpt::models::make_input(config).requires_grad_();
  const Step kind = step_kind(method);
  const Forward forward = method_forward(method, model, x);  // a sample like the steps' input
  for (auto& p : model->parameters()) p.mutable_grad() = torch::zeros_like(p);
  x.mutable_grad() = torch::zeros_like(x);
  for (int s = 0; s < steps; ++s) {
    if (!resilient) {
      run_step(kind, forward, x);
      continue;
    }
    ckpt::resilient_step(*model, [&](const ckpt::StepAttempt&) {
      run_step(kind, forward, x);
      return 0;
    });
  }
  if (g_policy_calls > 0) std::cerr << "policy calls per step: " << g_policy_calls / steps << "\n";
  return 0;
} catch (const std::exception& e) {
  std::cerr << "step_program: " << e.what() << "\n";
  return 1;
}
