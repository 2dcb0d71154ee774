// Per-region overhead of ckpt::checkpoint on a tiny region (a 1-element tensor, two ops), where
// the region's bookkeeping dominates: RNG stash, autograd graph surgery, recompute. Compare each
// checkpoint time with BM_Plain; the difference is the overhead per region in µs. The peak bytes
// of one iteration come from a MemoryManager backed by ckpt::MemoryTracker.
//
//   checkpoint_overhead_bench --benchmark_min_time=1 --benchmark_repetitions=3

#include <ckpt/checkpoint.h>
#include <ckpt/memory_tracker.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>

#include <memory>

namespace {

at::Tensor tiny_region(const at::Tensor& x) {
  return x.sin().mul(2.0);
}

at::Tensor leaf() {
  at::Tensor x = at::ones({1}).requires_grad_(true);
  return x;
}

// Forward and backward of the region without checkpointing.
void BM_Plain(benchmark::State& state) {
  at::set_num_threads(1);
  at::Tensor x = leaf();
  for (auto _ : state) {
    at::Tensor y = tiny_region(x);
    y.backward();
  }
}
BENCHMARK(BM_Plain)->Unit(benchmark::kMicrosecond);

// Forward only (grad mode on), without checkpointing.
void BM_PlainForward(benchmark::State& state) {
  at::set_num_threads(1);
  at::Tensor x = leaf();
  for (auto _ : state) {
    at::Tensor y = tiny_region(x);
    benchmark::DoNotOptimize(y);
  }
}
BENCHMARK(BM_PlainForward)->Unit(benchmark::kMicrosecond);

ckpt::CheckpointOptions options_of(const benchmark::State& state) {
  return ckpt::CheckpointOptions()
      .use_reentrant(state.range(0) != 0)
      .preserve_rng_state(state.range(1) != 0);
}

// Forward and backward through ckpt::checkpoint. Args: {reentrant, preserve_rng_state}.
void BM_Checkpoint(benchmark::State& state) {
  at::set_num_threads(1);
  at::Tensor x = leaf();
  const auto options = options_of(state);
  for (auto _ : state) {
    at::Tensor y = ckpt::checkpoint(options, tiny_region, x);
    y.backward();
  }
}
BENCHMARK(BM_Checkpoint)
    ->ArgNames({"reentrant", "rng"})
    ->ArgsProduct({{0, 1}, {0, 1}})
    ->Unit(benchmark::kMicrosecond);

// Forward only through ckpt::checkpoint (the region's graph is dropped with its output).
void BM_CheckpointForward(benchmark::State& state) {
  at::set_num_threads(1);
  at::Tensor x = leaf();
  const auto options = options_of(state);
  for (auto _ : state) {
    at::Tensor y = ckpt::checkpoint(options, tiny_region, x);
    benchmark::DoNotOptimize(y);
  }
}
BENCHMARK(BM_CheckpointForward)
    ->ArgNames({"reentrant", "rng"})
    ->ArgsProduct({{0, 1}, {0, 1}})
    ->Unit(benchmark::kMicrosecond);

// Reports the counting allocator's peak over each benchmark's last run.
class TrackerMemoryManager : public benchmark::MemoryManager {
 public:
  void Start() override {
    tracker_.reset_peak();
    start_ = tracker_.current_bytes();
  }
  void Stop(Result& result) override { fill(&result); }
  // Google Benchmark 1.7 still declares this one pure virtual (deprecated later): no override.
  void Stop(Result* result) { fill(result); }

 private:
  void fill(Result* result) const {
    result->max_bytes_used = tracker_.peak_bytes() - start_;
    result->net_heap_growth = tracker_.current_bytes() - start_;
  }
  ckpt::MemoryTracker tracker_;
  int64_t start_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  auto memory = std::make_unique<TrackerMemoryManager>();
  benchmark::RegisterMemoryManager(memory.get());
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  benchmark::RegisterMemoryManager(nullptr);
  return 0;
}
