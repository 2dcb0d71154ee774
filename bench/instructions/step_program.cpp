// One bench model trained for a number of steps by one method, nothing else: the program that
// bench/instructions/count.py runs under callgrind twice (two step counts), so that start-up,
// model building and planning cancel and the difference is the instructions of the steps alone.
//
// usage: step_program MODEL METHOD STEPS [--quick]
//   MODEL   mlp, resnet, transformer or small (ckpt bench's models)
//   METHOD  none | sequential:K | sequential_reentrant:K | planned:BUDGET (e.g. planned:100%)
//           | selective:K (K segments under save_matmuls()) | intercepted:K (K segments under a
//           policy that keeps nothing: the dispatch modes' interception alone; prints how many
//           operator calls the policy saw)

#include "bench_models.h"

#include <ckpt/planned_sequential.h>
#include <ckpt/profiler.h>
#include <ckpt/sequential.h>

#include <torch/torch.h>

#include <functional>
#include <iostream>
#include <stdexcept>
#include <string>

namespace {

using Forward = std::function<torch::Tensor(const torch::Tensor&)>;

int64_t g_policy_calls = 0;  // operator calls the "intercepted" method's policy saw

Forward method_forward(const std::string& method, torch::nn::Sequential model,
                       const torch::Tensor& sample) {
  if (method == "none")
    return [model](const torch::Tensor& x) mutable { return model->forward(x); };
  const auto colon = method.find(':');
  const std::string kind = method.substr(0, colon), value = method.substr(colon + 1);
  if (colon != std::string::npos && (kind == "sequential" || kind == "sequential_reentrant" ||
                                     kind == "selective" || kind == "intercepted")) {
    const int64_t segments = std::stoll(value);
    auto options = ckpt::CheckpointOptions().use_reentrant(kind == "sequential_reentrant");
    if (kind == "selective") options.policy(ckpt::save_matmuls());
    if (kind == "intercepted") {
      options.policy(ckpt::SelectivePolicy([](const ckpt::OpCall&) {
        ++g_policy_calls;
        return ckpt::CheckpointPolicy::PreferRecompute;
      }));
    }
    return [=](const torch::Tensor& x) {
      return ckpt::checkpoint_sequential(model, segments, x, options);
    };
  }
  if (colon != std::string::npos && kind == "planned") {
    // One repeat per measurement: under callgrind every profiled step is slow, and the plan at
    // the budgets counted here (the plain peak) does not depend on the times.
    const auto profiler = std::make_shared<ckpt::MeasuringProfiler>(
        ckpt::ProfileOptions().repeats(1).warmup(0).calibrate_to_step(false));
    ckpt::PlannedSequential planned(model, ckpt::Budget::parse(value),
                                    ckpt::PlannedSequentialOptions().profiler(profiler));
    planned->plan(sample);
    std::cerr << "schedule: " << ckpt::plan::to_string(planned->schedule()) << "\n";
    return [planned](const torch::Tensor& x) mutable { return planned->forward(x); };
  }
  throw std::invalid_argument(
      "unknown method '" + method +
      "' (none, sequential:K, sequential_reentrant:K, selective:K, intercepted:K, "
      "planned:BUDGET)");
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc < 4) {
    std::cerr << "usage: step_program MODEL METHOD STEPS [--quick]\n";
    return 2;
  }
  torch::set_num_threads(1);
  const bool quick = argc > 4 && std::string(argv[4]) == "--quick";
  const auto config = ckpt::models::model_config(argv[1], quick);
  torch::nn::Sequential model = ckpt::models::build_model(config);
  const torch::Tensor x = ckpt::models::make_input(config).requires_grad_();
  const Forward forward = method_forward(argv[2], model, x.detach());
  for (auto& p : model->parameters()) p.mutable_grad() = torch::zeros_like(p);
  x.mutable_grad() = torch::zeros_like(x);
  const int steps = std::stoi(argv[3]);
  for (int s = 0; s < steps; ++s) {  // the bench's step: forward, mean of squares, backward
    forward(x).square().mean().backward();
  }
  if (g_policy_calls > 0) std::cerr << "policy calls per step: " << g_policy_calls / steps << "\n";
  return 0;
} catch (const std::exception& e) {
  std::cerr << "step_program: " << e.what() << "\n";
  return 1;
}
