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

// What the solver limits of ckpt/plan/solvers.h (OptimalOptions) cost in time. The headers state
// the complexity; bench/results.md ("Planner costs") records these timings.

// Seconds per unit of work, `units` units each iteration.
benchmark::Counter per_unit(double units) {
  return benchmark::Counter(
      units, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

// Pairs of an entry (i, l) and a checkpoint j of an L-stage chain: (L+1)(L+2)(L+3)/6.
double entry_checkpoint_pairs(int64_t stages) {
  return static_cast<double>((stages + 1) * (stages + 2) * (stages + 3) / 6);
}

// The slot table at max_exact_stages (200), the longest chain solve_optimal gives it.
void BM_OptimalTableBuild(benchmark::State& state) {
  const Chain chain = bench_chain(static_cast<int>(state.range(0)));
  const int64_t budget = bench_budget(chain);
  for (auto _ : state) {
    const ckpt::plan::OptimalTable table(chain, budget);
    benchmark::DoNotOptimize(table.min_feasible_budget_bytes());
  }
}
BENCHMARK(BM_OptimalTableBuild)->ArgNames({"stages"})->Arg(200)->Unit(benchmark::kMillisecond);

// The exact program run to the end; "per_step" is the time of one of the steps max_exact_work
// counts.
void BM_SolveExact(benchmark::State& state) {
  const Chain chain = bench_chain(static_cast<int>(state.range(0)));
  const int64_t budget = bench_budget(chain);
  int64_t work = 0;
  for (auto _ : state) {
    const auto solution = ckpt::plan::solve_exact(chain, budget, int64_t{1} << 62);
    work = solution.work;
    benchmark::DoNotOptimize(solution.schedule);
  }
  state.counters["steps"] = static_cast<double>(work);
  state.counters["per_step"] = per_unit(static_cast<double>(work));
}
BENCHMARK(BM_SolveExact)->ArgNames({"stages"})->Arg(32)->Arg(64)->Unit(benchmark::kMillisecond);

// The dense min-max program at the stages max_min_memory_pairs allows (1000).
void BM_MinFeasibleBudget(benchmark::State& state) {
  const Chain chain = bench_chain(static_cast<int>(state.range(0)));
  for (auto _ : state) benchmark::DoNotOptimize(ckpt::plan::min_feasible_budget_bytes(chain));
  state.counters["per_pair"] = per_unit(entry_checkpoint_pairs(state.range(0)));
}
BENCHMARK(BM_MinFeasibleBudget)->ArgNames({"stages"})->Arg(1000)->Unit(benchmark::kMillisecond);

// The dense truncated program (8 steps an entry, as solve_optimal runs it) at the stages
// max_truncated_pairs allows (390): at the smallest budget, where solve_optimal runs it (halfway:
// 0), and halfway up, where its entries fill all 8 steps (halfway: 1).
void BM_SolveTruncated(benchmark::State& state) {
  const Chain chain = bench_chain(static_cast<int>(state.range(0)));
  const int64_t budget =
      state.range(1) ? bench_budget(chain) : ckpt::plan::min_feasible_budget_bytes(chain);
  for (auto _ : state) {
    benchmark::DoNotOptimize(ckpt::plan::solve_truncated(chain, budget, /*steps=*/8));
  }
  state.counters["per_pair"] = per_unit(entry_checkpoint_pairs(state.range(0)));
}
BENCHMARK(BM_SolveTruncated)
    ->ArgNames({"stages", "halfway"})
    ->Args({390, 0})
    ->Args({390, 1})
    ->Unit(benchmark::kMillisecond);

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
