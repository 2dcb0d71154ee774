#pragma once

// Profiles and oracles shared by the tests of the model of any network (ckpt/plan/model.h):
// a profile worked by hand, random profiles of two shapes, and enumeration of every choice.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "ckpt/plan/model.h"

namespace ckpt {
namespace plan {
namespace test {

inline constexpr int64_t kUnlimited = std::numeric_limits<int64_t>::max();

#define EXPECT_THROWS_WITH(statement, substring)                                             \
  try {                                                                                      \
    statement;                                                                               \
    ADD_FAILURE() << "no exception; expected one saying: " << (substring);                   \
  } catch (const std::invalid_argument& error) {                                             \
    EXPECT_NE(std::string(error.what()).find(substring), std::string::npos) << error.what(); \
  }

inline ModelProfile with_labels(ModelProfile profile) {
  profile.segment_labels.assign(profile.segment_peak_bytes.size(), "segment");
  return profile;
}

// Segments: 100 200 300 200 100. "a" covers 0..4, "b" covers 1..3.
inline ModelProfile hand_profile() {
  ModelProfile profile;
  profile.segment_peak_bytes = {100, 200, 300, 200, 100};
  profile.step_time = 10.0;
  profile.candidates.push_back(
      Candidate{"a",
                0,
                {CandidateOption{"stored", 2.0, 0, {}},
                 CandidateOption{"checkpointed", 3.0, 0, {10, -50, -50, -50, 20}},
                 CandidateOption{"offloaded", 2.5, 40, {0, -40, -40, -40, 0}}}});
  profile.candidates.push_back(
      Candidate{"b",
                1,
                {CandidateOption{"stored", 1.0, 0, {0, 0, 0}},
                 CandidateOption{"checkpointed", 1.75, 0, {5, -100, 30}}}});
  return with_labels(profile);
}

// A training step of n candidates run one after the other: segments forward 0..n-1, the loss,
// backward n-1..0; each candidate's window runs from its forward to its backward. Integer times,
// so that sums in any order are exact. Checkpointed: a constant plateau of what it doesn't keep,
// a recompute bump in its backward; selective keeps more and recomputes less; offloaded keeps its
// activations in host memory.
inline ModelProfile nested_profile(std::mt19937& rng, int n, int max_options, double jitter = 0.0) {
  std::uniform_int_distribution<int64_t> bytes(1000, 10000), tmp(0, 3000);
  std::uniform_int_distribution<int> seconds(1, 10), options(2, max_options);
  ModelProfile p;
  const int segments = 2 * n + 1;
  p.segment_peak_bytes.assign(static_cast<size_t>(segments), 0);
  std::vector<int64_t> kept(static_cast<size_t>(n));
  int64_t live = 0;
  for (int i = 0; i < n; ++i) {
    p.segment_peak_bytes[i] = live + tmp(rng);
    kept[i] = bytes(rng);
    live += kept[i];
  }
  p.segment_peak_bytes[n] = live + tmp(rng);
  for (int i = n - 1; i >= 0; --i) {
    p.segment_peak_bytes[segments - 1 - i] = live + tmp(rng);
    live -= kept[i];
  }
  p.step_time = 0.0;
  for (int i = 0; i < n; ++i) {
    const int length = segments - 2 * i;
    const double forward = seconds(rng);
    p.step_time += 3 * forward;
    Candidate c{"c" + std::to_string(i), i, {{"stored", 3 * forward, 0, {}}}};
    auto option = [&](const char* name, double extra, int64_t host, int64_t saved, int64_t bump) {
      // Jitter: the plateau varies per segment (what a measured one does), by up to that share.
      std::uniform_real_distribution<double> vary(1.0 - jitter, 1.0);
      std::vector<int64_t> delta(static_cast<size_t>(length));
      for (int64_t& d : delta) d = -static_cast<int64_t>(static_cast<double>(saved) * vary(rng));
      delta.front() = 0;
      delta.back() = bump;
      c.options.push_back(CandidateOption{name, 3 * forward + extra, host, delta});
    };
    const int64_t input = kept[i] / 4;
    const int count = options(rng);
    if (count > 1) option("checkpointed", forward, 0, kept[i] - input, tmp(rng) / 2);
    if (count > 2) option("selective", std::floor(forward / 3), 0, (kept[i] - input) / 2, 0);
    if (count > 3) option("offloaded", 1.0, kept[i] - input, kept[i] - input, tmp(rng) / 4);
    p.candidates.push_back(c);
  }
  return with_labels(p);
}

// Windows anywhere, deltas of either sign in each segment, host bytes on some options.
inline ModelProfile arbitrary_profile(std::mt19937& rng, int n, int max_options) {
  std::uniform_int_distribution<int> segments_count(1, 12), seconds(0, 10), options(2, max_options);
  std::uniform_int_distribution<int64_t> base(0, 20000), delta(-6000, 3000), host(0, 5000);
  ModelProfile p;
  const int segments = segments_count(rng);
  for (int k = 0; k < segments; ++k) p.segment_peak_bytes.push_back(base(rng));
  p.step_time = 100.0;
  for (int i = 0; i < n; ++i) {
    const int begin = std::uniform_int_distribution<int>(0, segments - 1)(rng);
    const int length = std::uniform_int_distribution<int>(1, segments - begin)(rng);
    Candidate c{"c" + std::to_string(i), begin, {{"stored", 5.0, 0, {}}}};
    const int count = options(rng);
    for (int o = 1; o < count; ++o) {
      std::vector<int64_t> d(static_cast<size_t>(length));
      for (int64_t& x : d) x = delta(rng);
      const int64_t h = rng() % 3 == 0 ? host(rng) : 0;
      c.options.push_back(CandidateOption{"o" + std::to_string(o), 5.0 + seconds(rng) - 3, h, d});
    }
    p.candidates.push_back(c);
  }
  return with_labels(p);
}

// Calls visit(choice) for every choice.
inline void for_each_choice(const ModelProfile& p,
                            const std::function<void(const std::vector<int>&)>& visit) {
  std::vector<int> choice(p.candidates.size(), 0);
  while (true) {
    visit(choice);
    size_t c = 0;
    for (; c < choice.size(); ++c) {
      if (++choice[c] < static_cast<int>(p.candidates[c].options.size())) break;
      choice[c] = 0;
    }
    if (c == choice.size()) return;
  }
}

// Whether no option of `choice` excludes another (checked here without the library's code).
inline bool valid(const ModelProfile& p, const std::vector<int>& choice) {
  for (size_t c = 0; c < choice.size(); ++c) {
    for (const OptionRef& ref : p.candidates[c].options[static_cast<size_t>(choice[c])].excludes) {
      if (choice[static_cast<size_t>(ref.candidate)] == ref.option) return false;
    }
  }
  return true;
}

// The lowest peak of any valid choice within the host budget, by enumerating them.
inline int64_t brute_force_min_peak(const ModelProfile& p, int64_t host_budget) {
  int64_t lowest = kUnlimited;
  for_each_choice(p, [&](const std::vector<int>& choice) {
    if (!valid(p, choice)) return;
    const ModelPrediction prediction = simulate_model(p, choice);
    if (prediction.host_bytes <= host_budget) lowest = std::min(lowest, prediction.peak_bytes);
  });
  return lowest;
}

// min_model_budget equals the brute-force minimum on `trials` profiles from `make(trial)`, and the
// heuristic alone misses it on some (so that the profiles test the search).
inline void expect_min_budget_matches_brute_force(int trials,
                                                  const std::function<ModelProfile(int)>& make) {
  int heuristic_missed = 0;
  for (int trial = 0; trial < trials; ++trial) {
    const ModelProfile p = make(trial);
    const int64_t lowest = brute_force_min_peak(p, kUnlimited);
    EXPECT_EQ(min_model_budget(p), lowest) << "trial " << trial;
    ModelSolverOptions heuristic;
    heuristic.max_exact_nodes = 0;
    heuristic_missed += min_model_budget(p, heuristic) > lowest;
  }
  EXPECT_GT(heuristic_missed, 0) << "the profiles are too easy to test the search";
}

inline int64_t total_host(const ModelProfile& p) {
  int64_t total = 0;
  for (const Candidate& c : p.candidates) {
    int64_t most = 0;
    for (const CandidateOption& o : c.options) most = std::max(most, o.host_bytes);
    total += most;
  }
  return total;
}

// Budgets from just below the lowest peak to the plain peak.
inline std::vector<int64_t> budgets(std::mt19937& rng, int64_t lowest, int64_t plain) {
  std::vector<int64_t> out{lowest - 1, lowest, plain};
  std::uniform_int_distribution<int64_t> between(lowest, std::max(lowest, plain));
  for (int i = 0; i < 4; ++i) out.push_back(between(rng));
  return out;
}

// solve_model's answer is the brute force's: as fast, of as low a peak, valid and within budgets.
inline void expect_same_as_brute_force(const ModelProfile& p, int64_t budget, int64_t host_budget) {
  ModelSolverOptions options;
  options.host_budget_bytes = host_budget;
  const ModelPlan plan = solve_model(p, budget, options);
  const ModelPlan oracle = solve_model_brute_force(p, budget, host_budget);
  ASSERT_EQ(plan.feasible, oracle.feasible) << "budget " << budget << " host " << host_budget;
  EXPECT_TRUE(plan.exact);
  if (!oracle.feasible) {
    EXPECT_TRUE(plan.choice.empty());
    return;
  }
  ASSERT_TRUE(valid(p, plan.choice)) << "budget " << budget << " host " << host_budget;
  const ModelPrediction again = simulate_model(p, plan.choice);
  EXPECT_EQ(again.time, plan.prediction.time);
  EXPECT_EQ(again.peak_bytes, plan.prediction.peak_bytes);
  EXPECT_LE(plan.prediction.peak_bytes, budget);
  EXPECT_LE(plan.prediction.host_bytes, host_budget);
  EXPECT_EQ(plan.prediction.time, oracle.prediction.time) << "budget " << budget;
  EXPECT_EQ(plan.prediction.peak_bytes, oracle.prediction.peak_bytes) << "ties: the lower peak";
}

// The shape of a random sweep: `trials` profiles of 1 to `max_n` candidates (4 options each, 3
// above `max_n - 2`), each at the budgets `budgets(rng, lowest, plain)` picks.
struct Sweep {
  int trials = 60;
  int max_n = 10;
  std::function<std::vector<int64_t>(std::mt19937&, int64_t, int64_t)> budgets;
};

// Exact solve == brute force (time, peak, validity, budgets) and min_model_budget == the lowest
// valid peak, over host budgets none, a third and all.
inline void sweep_against_brute_force(
    const std::function<ModelProfile(std::mt19937&, int, int)>& make, unsigned seed,
    const Sweep& sweep) {
  std::mt19937 rng(seed);
  for (int trial = 0; trial < sweep.trials; ++trial) {
    const int n = 1 + trial % sweep.max_n;
    const ModelProfile p = make(rng, n, n > sweep.max_n - 2 ? 3 : 4);
    for (int64_t host : {kUnlimited, total_host(p) / 3, int64_t{0}}) {
      const int64_t lowest = brute_force_min_peak(p, host);
      ModelSolverOptions options;
      options.host_budget_bytes = host;
      EXPECT_EQ(min_model_budget(p, options), lowest) << "trial " << trial << " host " << host;
      for (int64_t budget : sweep.budgets(rng, lowest, p.plain_peak_bytes())) {
        expect_same_as_brute_force(p, budget, host);
      }
    }
  }
}

}  // namespace test
}  // namespace plan
}  // namespace ckpt
