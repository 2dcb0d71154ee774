// Micro-benchmarks of the planning layer: the optimal DP, the simulator, Revolve's closed form.
// Google Benchmark 1.7.1 or newer.

#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>

#include "ckpt/plan/chain.h"
#include "ckpt/plan/simulator.h"
#include "ckpt/plan/solvers.h"

namespace {

using ckpt::plan::Chain;

// A heterogeneous chain (fixed seed): activation sizes between 1 and 64 MiB.
Chain bench_chain(int stages) {
  std::mt19937 rng(2024);
  std::uniform_int_distribution<int64_t> size(1 << 20, 64 << 20);
  std::uniform_real_distribution<double> time(1e-3, 1e-2);
  Chain chain;
  chain.input_bytes = size(rng);
  for (int i = 0; i < stages; ++i) {
    ckpt::plan::Stage stage;
    stage.forward_time = time(rng);
    stage.backward_time = 2 * stage.forward_time;
    stage.output_bytes = size(rng);
    stage.saved_bytes = stage.output_bytes * 3;
    stage.forward_tmp_bytes = size(rng) / 4;
    stage.backward_tmp_bytes = size(rng) / 4;
    chain.stages.push_back(stage);
  }
  return chain;
}

// Budget halfway between the minimum and the no-checkpoint peak.
int64_t bench_budget(const Chain& chain) {
  const int64_t top =
      ckpt::plan::simulate(chain, ckpt::plan::solve_no_checkpoint(chain)).peak_bytes;
  const int64_t bottom = ckpt::plan::min_feasible_budget_bytes(chain);
  return bottom + (top - bottom) / 2;
}

void BM_SolveOptimal(benchmark::State& state) {
  const Chain chain = bench_chain(static_cast<int>(state.range(0)));
  const int64_t budget = bench_budget(chain);
  ckpt::plan::OptimalOptions options;
  options.slots = static_cast<int>(state.range(1));
  for (auto _ : state) {
    auto schedule = ckpt::plan::solve_optimal(chain, budget, options);
    benchmark::DoNotOptimize(schedule);
  }
}
BENCHMARK(BM_SolveOptimal)
    ->ArgNames({"stages", "slots"})
    ->Args({16, 500})
    ->Args({64, 500})
    ->Args({128, 500})
    ->Args({256, 500})
    ->Unit(benchmark::kMillisecond);

// Answering one more budget from a built table (no re-solve).
void BM_OptimalTableSolve(benchmark::State& state) {
  const Chain chain = bench_chain(static_cast<int>(state.range(0)));
  const int64_t budget = bench_budget(chain);
  const ckpt::plan::OptimalTable table(chain, 2 * budget);
  for (auto _ : state) {
    auto schedule = table.solve(budget);
    benchmark::DoNotOptimize(schedule);
  }
}
BENCHMARK(BM_OptimalTableSolve)->ArgNames({"stages"})->Arg(64)->Unit(benchmark::kMicrosecond);

void BM_Simulate(benchmark::State& state) {
  const Chain chain = bench_chain(static_cast<int>(state.range(0)));
  const auto schedule = ckpt::plan::solve_optimal(chain, bench_budget(chain));
  for (auto _ : state) {
    auto result = ckpt::plan::simulate(chain, *schedule);
    benchmark::DoNotOptimize(result);
  }
  state.counters["ops"] = static_cast<double>(schedule->ops.size());
}
BENCHMARK(BM_Simulate)->ArgNames({"stages"})->Arg(16)->Arg(64)->Arg(128);

void BM_RevolveClosedForm(benchmark::State& state) {
  const int steps = static_cast<int>(state.range(0));
  const int slots = static_cast<int>(state.range(1));
  for (auto _ : state) {
    benchmark::DoNotOptimize(ckpt::plan::revolve_forward_count(steps, slots));
  }
}
BENCHMARK(BM_RevolveClosedForm)
    ->ArgNames({"steps", "slots"})
    ->Args({64, 8})
    ->Args({1000, 32})
    ->Args({100000, 10});

}  // namespace

BENCHMARK_MAIN();
