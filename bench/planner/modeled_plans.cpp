// Plans without the device (issue 51, item 3): each bench model profiled on the meta device under
// a ModeledDevice of the CPU, against a profile measured on the CPU, in the same run. Prints the
// peaks both predict (storing everything, the smallest budget, a plan halfway), how long each
// profile took, and the peak a plan made from the meta profile reaches when the real model runs
// it (counting allocator, above what lived before the step), beside a plan from the real profile.
//
//   modeled_plans [--quick] [--threads N] [--models a,b] [--times-smallest X]

#include <ckpt/memory_tracker.h>
#include <ckpt/modeled_device.h>
#include <ckpt/plan/simulator.h>
#include <ckpt/plan/solvers.h>
#include <ckpt/planned_sequential.h>
#include <ckpt/profiler.h>

#include "bench_models.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double percent(int64_t modeled, int64_t real) {
  return 100.0 * static_cast<double>(modeled - real) / static_cast<double>(real);
}

// The peak of a step above what lived before it (x_0 counted, as the planner counts it).
int64_t step_peak(ckpt::PlannedSequential& planned, const at::Tensor& x) {
  for (auto& p : planned->parameters()) p.mutable_grad().reset();
  ckpt::MemoryTracker tracker;
  tracker.reset_peak();
  const int64_t before = tracker.current_bytes() - static_cast<int64_t>(x.nbytes());
  planned(x).sum().backward();
  return tracker.peak_bytes() - before;
}

void compare(const std::string& name, bool quick, double times_smallest,
             const ckpt::DeviceProfile& device) {
  const auto config = ckpt::models::model_config(name, quick);
  auto model = ckpt::models::build_model(config);
  const auto x = ckpt::models::make_input(config);
  auto start = Clock::now();
  const auto real = ckpt::profile_chain({model->begin(), model->end()}, x);
  const double real_seconds = seconds_since(start);

  auto meta = ckpt::models::build_model(config);
  ckpt::move_to_meta(*meta);
  start = Clock::now();
  ckpt::plan::Chain modeled;
  {
    const ckpt::ModeledDevice modeled_device(device);
    modeled = ckpt::profile_chain({meta->begin(), meta->end()},
                                  at::empty(x.sizes(), x.options().device(c10::kMeta)));
  }
  const double meta_seconds = seconds_since(start);

  const ckpt::plan::OptimalOptions options;
  const int64_t smallest = ckpt::plan::min_feasible_budget_bytes(modeled, options);
  const int64_t largest =
      ckpt::plan::simulate(modeled, ckpt::plan::solve_no_checkpoint(modeled)).peak_bytes;
  double worst = 0;
  for (int64_t budget : {smallest, (smallest + largest) / 2, largest}) {
    const auto schedule = ckpt::plan::solve_optimal(modeled, budget, options);
    if (!schedule) continue;
    const double difference = percent(ckpt::plan::simulate(modeled, *schedule).peak_bytes,
                                      ckpt::plan::simulate(real, *schedule).peak_bytes);
    worst = std::max(worst, std::abs(difference));
  }
  const int64_t budget = times_smallest > 0
                             ? static_cast<int64_t>(times_smallest * static_cast<double>(smallest))
                             : (smallest + largest) / 2;
  ckpt::PlannedSequential planned(
      model, ckpt::Budget::bytes(budget),
      ckpt::PlannedSequentialOptions().profiler(std::make_shared<ckpt::ModeledProfiler>(device)));
  planned->plan(x);
  const int64_t measured = step_peak(planned, x);
  ckpt::PlannedSequential on_device(model, ckpt::Budget::bytes(budget));
  on_device->plan(x);
  const int64_t measured_on_device = step_peak(on_device, x);
  std::printf("| %s | %.2f%% | %.3f | %.3f | %lld | %lld | %lld | %s | %lld | %lld |\n",
              name.c_str(), worst, real_seconds, meta_seconds, static_cast<long long>(budget),
              static_cast<long long>(planned->prediction().peak_bytes),
              static_cast<long long>(measured), measured <= budget ? "yes" : "no",
              static_cast<long long>(on_device->prediction().peak_bytes),
              static_cast<long long>(measured_on_device));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Plans without the device against plans from a real profile"};
  bool quick = false;
  int threads = 1;
  double times_smallest = 0;
  std::vector<std::string> names = ckpt::models::model_names();
  app.add_flag("--quick", quick, "The bench's small sizes");
  app.add_option("--models", names, "Which bench models")->delimiter(',');
  app.add_option("--times-smallest", times_smallest,
                 "Run the plans at this multiple of the smallest budget (default: halfway to "
                 "storing everything)");
  app.add_option("--threads", threads, "Intra-op threads")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  at::set_num_threads(threads);
  ckpt::DeviceProfile cpu = ckpt::DeviceProfile::measure(c10::Device(c10::kCPU));
  std::printf("CPU profile: %.1f GFLOP/s, %.1f GB/s, %.2f us per operator\n\n",
              cpu.flops_per_second / 1e9, cpu.bytes_per_second / 1e9,
              cpu.seconds_per_operator * 1e6);
  std::printf(
      "| model | largest peak difference | real profile (s) | meta profile (s) | "
      "budget | predicted | measured | fits | real profile's plan: predicted | measured |\n"
      "|---|---|---|---|---|---|---|---|---|---|\n");
  for (const std::string& name : names) compare(name, quick, times_smallest, cpu);
}
