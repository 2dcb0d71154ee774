// What planning any model costs: solve_model and min_model_budget (ckpt/plan/model.h) on
// 200-candidate profiles of realistic shape, one whose windows nest (a chain of blocks) and one
// whose windows cross (a U-Net's skips); each also with "recomputed" options and their
// exclusions. Google Benchmark 1.7.1 or newer; no LibTorch.

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/plan/model.h"

namespace {

using ckpt::plan::Candidate;
using ckpt::plan::CandidateOption;
using ckpt::plan::ModelProfile;
using ckpt::plan::OptionRef;

constexpr int64_t kMiB = 1 << 20;

// Adds `bytes` to the segments [first, last] of the plain step.
void live(ModelProfile& p, int first, int last, int64_t bytes) {
  for (int k = first; k <= last; ++k) p.segment_peak_bytes[k] += bytes;
}

// An option over the window [begin, end]: `bump` in its first segment, `plateau` (varying by up to
// 10% per segment, as measured ones do) from `from` to end - 1, `recompute` in its last.
CandidateOption option(std::mt19937& rng, const char* name, double time, int64_t host, int begin,
                       int end, int from, int64_t plateau, int64_t recompute) {
  std::uniform_real_distribution<double> vary(0.9, 1.0);
  std::vector<int64_t> delta(static_cast<size_t>(end - begin + 1), 0);
  for (int k = from; k < end; ++k) delta[k - begin] = static_cast<int64_t>(plateau * vary(rng));
  delta.back() = recompute;
  return CandidateOption{name, time, host, delta};
}

// A block (checkpointed, selective, offloaded) whose window runs from segment f to segment b.
Candidate block(std::mt19937& rng, const std::string& name, int f, int b, int64_t kept,
                double seconds) {
  return Candidate{
      name,
      f,
      {option(rng, "stored", 3 * seconds, 0, f, b, b, 0, 0),
       option(rng, "checkpointed", 4 * seconds, 0, f, b, f + 1, -kept * 3 / 4, kept / 8),
       option(rng, "selective", 3.3 * seconds, 0, f, b, f + 1, -kept / 2, 0),
       option(rng, "offloaded", 3.1 * seconds, kept * 3 / 4, f, b, f + 1, -kept * 3 / 4,
              kept / 16)}};
}

// n blocks in a chain: forward 0..n-1, the loss, backward n-1..0.
ModelProfile nested_profile(int n) {
  std::mt19937 rng(2026);
  std::uniform_int_distribution<int64_t> bytes(kMiB, 64 * kMiB);
  std::uniform_real_distribution<double> seconds(1e-3, 1e-2);
  ModelProfile p;
  p.segment_peak_bytes.assign(static_cast<size_t>(2 * n + 1), 0);
  for (int i = 0; i < n; ++i) {
    const int f = i, b = 2 * n - i;
    const int64_t kept = bytes(rng);
    live(p, f, b, kept);
    live(p, f, f, bytes(rng) / 4);  // the forward's temporaries
    p.candidates.push_back(block(rng, "block" + std::to_string(i), f, b, kept, seconds(rng)));
    p.step_time += 3 * seconds(rng);
  }
  p.segment_labels.assign(p.segment_peak_bytes.size(), "segment");
  return p;
}

// A U-Net of `levels` encoder and decoder blocks. Forward: e0..e(L-1), d(L-1)..d0; backward in
// reverse. The skip from encoder i lives until decoder i's backward; offloading it is an option of
// the decoder, whose window therefore starts at the encoder's forward and crosses the windows of
// the deeper encoders.
ModelProfile unet_profile(int levels) {
  std::mt19937 rng(2027);
  std::uniform_int_distribution<int64_t> bytes(kMiB, 64 * kMiB);
  std::uniform_real_distribution<double> seconds(1e-3, 1e-2);
  const int L = levels;
  ModelProfile p;
  p.segment_peak_bytes.assign(static_cast<size_t>(4 * L + 1), 0);
  for (int i = 0; i < L; ++i) {
    const int fe = i, fd = 2 * L - 1 - i, bd = 2 * L + 1 + i, be = 4 * L - i;
    const int64_t enc = bytes(rng), dec = bytes(rng), skip = bytes(rng);
    live(p, fe, be, enc);
    live(p, fd, bd, dec);
    live(p, fe, bd, skip);
    const double se = seconds(rng), sd = seconds(rng);
    p.candidates.push_back(block(rng, "enc" + std::to_string(i), fe, be, enc, se));
    Candidate d = block(rng, "dec" + std::to_string(i), fd, bd, dec, sd);
    d.window_begin = fe;  // every option covers the skip's lifetime; only offloading changes it
    for (CandidateOption& o : d.options) o.peak_delta.insert(o.peak_delta.begin(), fd - fe, 0);
    d.options.push_back(option(rng, "skip offloaded", 3.2 * sd, skip, fe, bd, fe + 1, -skip, 0));
    p.candidates.push_back(d);
    p.step_time += 3 * (se + sd);
  }
  p.segment_labels.assign(p.segment_peak_bytes.size(), "segment");
  return p;
}

// "Recomputed" for candidate i, whose outputs its consumer c (a later candidate) recomputes
// instead of keeping: what checkpointed saves, and c's input (a third of the most c's
// checkpointed saves) under c's window, for one more forward of i.
CandidateOption recomputed(const Candidate& i, const Candidate& c) {
  CandidateOption option = i.options[1];
  option.name = "recomputed";
  option.time += i.options[0].time / 3;
  const std::vector<int64_t>& inner = c.options[1].peak_delta;
  const int64_t input = -*std::min_element(inner.begin(), inner.end()) / 3;
  for (size_t k = 1; k + 1 < inner.size(); ++k) {
    const int at = c.window_begin + static_cast<int>(k) - i.window_begin;
    if (at >= 0 && at < static_cast<int>(option.peak_delta.size())) option.peak_delta[at] -= input;
  }
  return option;
}

// About a third of the candidates get "recomputed", which excludes every option but
// "checkpointed" (1) of the next 1-3 candidates (its consumers) and "recomputed" of 1-2 earlier
// ones (its inputs' producers), as ckpt::profile_model offers it.
ModelProfile with_recomputed(ModelProfile p) {
  std::mt19937 rng(2028);
  const int n = static_cast<int>(p.candidates.size());
  std::vector<int> added(static_cast<size_t>(n), -1);  // the option's index, or -1
  for (int i = 0; i + 1 < n; ++i) {
    if (rng() % 3 != 0) continue;
    CandidateOption option = recomputed(p.candidates[i], p.candidates[i + 1]);
    const int consumers = 1 + static_cast<int>(rng() % 3);
    for (int j = i + 1; j < std::min(n, i + 1 + consumers); ++j) {
      for (int o = 0; o < static_cast<int>(p.candidates[j].options.size()); ++o) {
        if (o != 1) option.excludes.push_back(OptionRef{j, o});
      }
    }
    for (int j = i - 1, left = 1 + static_cast<int>(rng() % 2); j >= 0 && left > 0; --j) {
      if (added[j] < 0) continue;
      option.excludes.push_back(OptionRef{j, added[j]});
      --left;
    }
    added[i] = static_cast<int>(p.candidates[i].options.size());
    p.candidates[i].options.push_back(option);
  }
  return p;
}

ModelProfile bench_profile(int64_t kind, int64_t exclusions) {
  ModelProfile p = kind == 0 ? nested_profile(200) : unet_profile(100);
  return exclusions ? with_recomputed(std::move(p)) : p;
}

// Argument `way`: the budget's place, in percent of the way from the lowest peak to the plain.
void BM_SolveModel(benchmark::State& state) {
  const ModelProfile profile = bench_profile(state.range(0), state.range(1));
  const int64_t lowest = ckpt::plan::min_model_budget(profile);
  const int64_t budget = lowest + (profile.plain_peak_bytes() - lowest) * state.range(2) / 100;
  ckpt::plan::ModelPlan plan;
  for (auto _ : state) {
    plan = ckpt::plan::solve_model(profile, budget);
    benchmark::DoNotOptimize(plan);
  }
  state.counters["exact"] = plan.exact;
  state.counters["proven_gap_%"] = 100 * plan.gap;
  state.counters["extra_time_%"] = 100 * (plan.prediction.time / profile.step_time - 1);
  state.counters["peak_%_of_plain"] =
      100.0 * static_cast<double>(plan.prediction.peak_bytes) / profile.plain_peak_bytes();
}
BENCHMARK(BM_SolveModel)
    ->ArgNames({"unet", "exclusions", "way"})
    ->ArgsProduct({{0, 1}, {0, 1}, {0, 1, 5, 20, 50}})
    ->Unit(benchmark::kMillisecond);

void BM_MinModelBudget(benchmark::State& state) {
  const ModelProfile profile = bench_profile(state.range(0), state.range(1));
  int64_t lowest = 0;
  for (auto _ : state) {
    lowest = ckpt::plan::min_model_budget(profile);
    benchmark::DoNotOptimize(lowest);
  }
  state.counters["min_%_of_plain"] =
      100.0 * static_cast<double>(lowest) / profile.plain_peak_bytes();
}
BENCHMARK(BM_MinModelBudget)
    ->ArgNames({"unet", "exclusions"})
    ->ArgsProduct({{0, 1}, {0, 1}})
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
