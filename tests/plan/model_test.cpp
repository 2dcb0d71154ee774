// The model of any network (ckpt/plan/model.h): the profile's checks, the simulator on examples
// worked by hand, solve_model and min_model_budget against enumerating every choice, and the
// heuristic alone against the exact optimum.

#include "ckpt/plan/model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <iostream>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace ckpt {
namespace plan {
namespace {

constexpr int64_t kUnlimited = std::numeric_limits<int64_t>::max();

#define EXPECT_THROWS_WITH(statement, substring)                                             \
  try {                                                                                      \
    statement;                                                                               \
    ADD_FAILURE() << "no exception; expected one saying: " << (substring);                   \
  } catch (const std::invalid_argument& error) {                                             \
    EXPECT_NE(std::string(error.what()).find(substring), std::string::npos) << error.what(); \
  }

ModelProfile with_labels(ModelProfile profile) {
  profile.segment_labels.assign(profile.segment_peak_bytes.size(), "segment");
  return profile;
}

// Segments: 100 200 300 200 100. "a" covers 0..4, "b" covers 1..3.
ModelProfile hand_profile() {
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

TEST(ModelProfileTest, PlainPeakIsTheLargestSegment) {
  EXPECT_EQ(hand_profile().plain_peak_bytes(), 300);
  EXPECT_EQ(ModelProfile().plain_peak_bytes(), 0);
}

TEST(ModelProfileTest, ValidateSaysWhatIsWrong) {
  ModelProfile p = hand_profile();
  p.segment_labels.pop_back();
  EXPECT_THROWS_WITH(p.validate(), "4 segment labels for 5 segments");
  p = hand_profile();
  p.step_time = -1.0;
  EXPECT_THROWS_WITH(p.validate(), "step_time");
  p = hand_profile();
  p.candidates[1].options.clear();
  EXPECT_THROWS_WITH(p.validate(), "candidate 1 ('b') has no options");
  p = hand_profile();
  p.candidates[1].options[0].peak_delta[2] = 1;
  EXPECT_THROWS_WITH(p.validate(), "option 0, the stored mode");
  p = hand_profile();
  p.candidates[0].options[0].host_bytes = 1;
  EXPECT_THROWS_WITH(p.validate(), "option 0, the stored mode");
  p = hand_profile();
  p.candidates[1].window_begin = 3;
  EXPECT_THROWS_WITH(p.validate(), "has deltas up to segment 5 but the timeline has 5 segments");
  p = hand_profile();
  p.candidates[1].window_begin = -1;
  EXPECT_THROWS_WITH(p.validate(), "window_begin -1 outside");
  p = hand_profile();
  p.candidates[0].options[2].time = std::nan("");
  EXPECT_THROWS_WITH(p.validate(), "candidate 0 ('a') option 2 ('offloaded') has time");
  p = hand_profile();
  p.candidates[0].options[1].time = -0.5;
  EXPECT_THROWS_WITH(p.validate(), "finite seconds, not negative");
  p = hand_profile();
  p.candidates[0].options[2].host_bytes = -4;
  EXPECT_THROWS_WITH(p.validate(), "negative host_bytes");
  EXPECT_NO_THROW(hand_profile().validate());
}

TEST(ModelSimulateTest, AddsTheChosenDeltasTimesAndHostBytes) {
  const ModelProfile p = hand_profile();
  ModelPrediction plain = simulate_model(p, {0, 0});
  EXPECT_EQ(plain.time, 10.0);
  EXPECT_EQ(plain.peak_bytes, 300);
  EXPECT_EQ(plain.peak_segment, 2);
  EXPECT_EQ(plain.host_bytes, 0);
  // a checkpointed, b checkpointed: 110 155 150 180 120.
  ModelPrediction both = simulate_model(p, {1, 1});
  EXPECT_EQ(both.time, 10.0 + 1.0 + 0.75);
  EXPECT_EQ(both.peak_bytes, 180);
  EXPECT_EQ(both.peak_segment, 3);
  // a offloaded, b stored: 100 160 260 160 100.
  ModelPrediction offloaded = simulate_model(p, {2, 0});
  EXPECT_EQ(offloaded.time, 10.5);
  EXPECT_EQ(offloaded.peak_bytes, 260);
  EXPECT_EQ(offloaded.host_bytes, 40);
  // a stored, b checkpointed, segment 1 raised: 100 230 200 230 100; the first of equal peaks
  // is reported.
  ModelProfile tie = p;
  tie.segment_peak_bytes = {100, 225, 300, 200, 100};
  ModelPrediction first = simulate_model(tie, {0, 1});
  EXPECT_EQ(first.peak_bytes, 230);
  EXPECT_EQ(first.peak_segment, 1);
}

TEST(ModelSimulateTest, RejectsABadChoice) {
  const ModelProfile p = hand_profile();
  EXPECT_THROWS_WITH(simulate_model(p, {0}), "the choice has 1 entries but the profile has 2");
  EXPECT_THROWS_WITH(simulate_model(p, {0, 2}), "option 2 of candidate 1 ('b') is out of range");
  EXPECT_THROWS_WITH(simulate_model(p, {-1, 0}), "option -1 of candidate 0 ('a')");
  const ModelPrediction empty = simulate_model(ModelProfile(), {});
  EXPECT_EQ(empty.peak_bytes, 0);
  EXPECT_EQ(empty.peak_segment, -1);
}

TEST(ModelSolverTest, HandExample) {
  const ModelProfile p = hand_profile();
  // a offloaded (260 bytes, 0.5 s) beats b checkpointed (230 bytes, 0.75 s).
  ModelPlan plan = solve_model(p, 260);
  ASSERT_TRUE(plan.feasible);
  EXPECT_TRUE(plan.exact);
  EXPECT_EQ(plan.choice, (std::vector<int>{2, 0}));
  EXPECT_EQ(plan.prediction.peak_bytes, 260);
  ModelSolverOptions no_host;
  no_host.host_budget_bytes = 0;
  plan = solve_model(p, 260, no_host);  // without host memory: b checkpointed
  EXPECT_EQ(plan.choice, (std::vector<int>{0, 1}));
  EXPECT_EQ(plan.prediction.time, 10.75);
  // Equal times: the lower peak. Both cost 0.5 s once b's recompute is that cheap.
  ModelProfile tie = p;
  tie.candidates[1].options[1].time = 1.5;
  plan = solve_model(tie, 300);
  EXPECT_EQ(plan.choice, (std::vector<int>{0, 0}));
  plan = solve_model(tie, 299);
  EXPECT_EQ(plan.choice, (std::vector<int>{0, 1}));  // 230 bytes, not a offloaded's 260
  EXPECT_EQ(min_model_budget(p), 180);
  plan = solve_model(p, 179);
  EXPECT_FALSE(plan.feasible);
  EXPECT_TRUE(plan.choice.empty());
}

// No candidates, no segments, candidates whose options change nothing, a window at the end.
TEST(ModelSolverTest, EdgeProfiles) {
  ModelProfile none = with_labels(ModelProfile{{5, 7}, {}, 1.0, {}});
  EXPECT_TRUE(solve_model(none, 7).feasible);
  EXPECT_TRUE(solve_model(none, 7).exact);
  EXPECT_TRUE(solve_model(none, 7).choice.empty());
  EXPECT_FALSE(solve_model(none, 6).feasible);
  EXPECT_EQ(min_model_budget(none), 7);
  ModelProfile empty;
  empty.candidates.push_back(Candidate{"idle", 0, {{"stored", 1.0, 0, {}}, {"slow", 2.0, 0, {}}}});
  const ModelPlan plan = solve_model(empty, 0);
  ASSERT_TRUE(plan.feasible);
  EXPECT_EQ(plan.choice, (std::vector<int>{0}));
  EXPECT_EQ(plan.prediction.peak_segment, -1);
  EXPECT_FALSE(solve_model(empty, -1).feasible);
  EXPECT_EQ(min_model_budget(empty), 0);
  ModelProfile end = hand_profile();
  end.candidates.push_back(Candidate{"end", 5, {{"stored", 1.0, 0, {}}, {"host", 0.5, 9, {}}}});
  ModelSolverOptions host;
  host.host_budget_bytes = 9;
  EXPECT_EQ(solve_model(end, 300, host).choice, (std::vector<int>{0, 0, 1}));  // faster, no bytes
  for (int64_t nodes : {int64_t{0}, int64_t{2'000'000}}) {
    host.max_exact_nodes = nodes;
    EXPECT_EQ(solve_model(end, 180, host).choice, solve_model_brute_force(end, 180, 9).choice);
  }
}

TEST(ModelSolverTest, RejectsBadOptions) {
  ModelSolverOptions options;
  options.host_budget_bytes = -1;
  EXPECT_THROWS_WITH(solve_model(hand_profile(), 300, options), "host_budget_bytes -1 is negative");
  EXPECT_THROWS_WITH(min_model_budget(hand_profile(), options), "host_budget_bytes -1");
  options = ModelSolverOptions();
  options.max_exact_nodes = -2;
  EXPECT_THROWS_WITH(solve_model(hand_profile(), 300, options), "max_exact_nodes -2");
  ModelProfile bad = hand_profile();
  bad.candidates[0].options.clear();
  EXPECT_THROWS_WITH(solve_model(bad, 300), "has no options");
}

TEST(ModelSolverTest, BruteForceRefusesMoreThanTwoToTheTwentyChoices) {
  ModelProfile p;
  p.segment_peak_bytes = {1};
  p.segment_labels = {"only"};
  for (int i = 0; i < 21; ++i) {
    p.candidates.push_back(Candidate{"c", 0, {{"stored", 0.0, 0, {}}, {"x", 1.0, 0, {-1}}}});
  }
  EXPECT_THROWS_WITH(solve_model_brute_force(p, 1), "more than 2^20 choices");
  p.candidates.pop_back();
  EXPECT_TRUE(solve_model_brute_force(p, 1).feasible);
}

// ~~~ Random profiles ~~~

// A training step of n candidates run one after the other: segments forward 0..n-1, the loss,
// backward n-1..0; each candidate's window runs from its forward to its backward. Integer times,
// so that sums in any order are exact. Checkpointed: a constant plateau of what it doesn't keep,
// a recompute bump in its backward; selective keeps more and recomputes less; offloaded keeps its
// activations in host memory.
ModelProfile nested_profile(std::mt19937& rng, int n, int max_options, double jitter = 0.0) {
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
ModelProfile arbitrary_profile(std::mt19937& rng, int n, int max_options) {
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
void for_each_choice(const ModelProfile& p,
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

int64_t brute_force_min_peak(const ModelProfile& p, int64_t host_budget) {
  int64_t lowest = kUnlimited;
  for_each_choice(p, [&](const std::vector<int>& choice) {
    const ModelPrediction prediction = simulate_model(p, choice);
    if (prediction.host_bytes <= host_budget) lowest = std::min(lowest, prediction.peak_bytes);
  });
  return lowest;
}

int64_t total_host(const ModelProfile& p) {
  int64_t total = 0;
  for (const Candidate& c : p.candidates) {
    int64_t most = 0;
    for (const CandidateOption& o : c.options) most = std::max(most, o.host_bytes);
    total += most;
  }
  return total;
}

// Budgets from just below the lowest peak to the plain peak.
std::vector<int64_t> budgets(std::mt19937& rng, int64_t lowest, int64_t plain) {
  std::vector<int64_t> out{lowest - 1, lowest, plain};
  std::uniform_int_distribution<int64_t> between(lowest, std::max(lowest, plain));
  for (int i = 0; i < 4; ++i) out.push_back(between(rng));
  return out;
}

void expect_same_as_brute_force(const ModelProfile& p, int64_t budget, int64_t host_budget) {
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
  const ModelPrediction again = simulate_model(p, plan.choice);
  EXPECT_EQ(again.time, plan.prediction.time);
  EXPECT_EQ(again.peak_bytes, plan.prediction.peak_bytes);
  EXPECT_LE(plan.prediction.peak_bytes, budget);
  EXPECT_LE(plan.prediction.host_bytes, host_budget);
  EXPECT_EQ(plan.prediction.time, oracle.prediction.time) << "budget " << budget;
  EXPECT_EQ(plan.prediction.peak_bytes, oracle.prediction.peak_bytes) << "ties: the lower peak";
}

void sweep_against_brute_force(const std::function<ModelProfile(std::mt19937&, int, int)>& make,
                               unsigned seed) {
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 60; ++trial) {
    const int n = 1 + trial % 10;
    const ModelProfile p = make(rng, n, n > 8 ? 3 : 4);
    const int64_t all_host = total_host(p);
    for (int64_t host : {kUnlimited, all_host / 3, int64_t{0}}) {
      const int64_t lowest = brute_force_min_peak(p, host);
      ModelSolverOptions options;
      options.host_budget_bytes = host;
      EXPECT_EQ(min_model_budget(p, options), lowest) << "trial " << trial << " host " << host;
      for (int64_t budget : budgets(rng, lowest, p.plain_peak_bytes())) {
        expect_same_as_brute_force(p, budget, host);
      }
    }
  }
}

TEST(ModelSolverTest, MatchesBruteForceOnNestedWindows) {
  sweep_against_brute_force(
      [](std::mt19937& rng, int n, int options) {
        return nested_profile(rng, n, options, n % 2 ? 0.2 : 0.0);
      },
      1);
}

TEST(ModelSolverTest, MatchesBruteForceOnArbitraryWindows) {
  sweep_against_brute_force(arbitrary_profile, 2);
}

// More candidates, two options each: where the heuristic alone misses the lowest peak, the
// search must find it.
TEST(ModelSolverTest, MinBudgetMatchesBruteForceOnLargerProfiles) {
  std::mt19937 rng(7);
  int heuristic_missed = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const int n = 12 + trial % 7;
    const ModelProfile p =
        trial % 2 ? nested_profile(rng, n, 2, 0.2) : arbitrary_profile(rng, n, 2);
    const int64_t lowest = brute_force_min_peak(p, kUnlimited);
    EXPECT_EQ(min_model_budget(p), lowest) << "trial " << trial;
    ModelSolverOptions heuristic;
    heuristic.max_exact_nodes = 0;
    heuristic_missed += min_model_budget(p, heuristic) > lowest;
  }
  EXPECT_GT(heuristic_missed, 0) << "the profiles are too easy to test the search";
}

// With the exact search off, min_model_budget is still a budget solve_model solves, and the
// heuristic's peak is never below the true lowest.
TEST(ModelSolverTest, HeuristicMinBudgetIsAlwaysSolvable) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 400; ++trial) {
    const int n = 1 + trial % 40;
    const ModelProfile p = trial % 4 ? arbitrary_profile(rng, n, 4) : nested_profile(rng, n, 4);
    for (int64_t host : {kUnlimited, total_host(p) / 4}) {
      ModelSolverOptions options;
      options.host_budget_bytes = host;
      options.max_exact_nodes = trial % 3 == 0 ? 0 : 5;
      const int64_t budget = min_model_budget(p, options);
      if (n <= 10) {
        EXPECT_GE(budget, brute_force_min_peak(p, host));
      }
      const ModelPlan plan = solve_model(p, budget, options);
      ASSERT_TRUE(plan.feasible) << "trial " << trial << " budget " << budget;
      EXPECT_LE(plan.prediction.peak_bytes, budget);
      EXPECT_LE(plan.prediction.host_bytes, host);
    }
  }
}

TEST(ModelSolverTest, InfeasibleBudgetGivesNoChoice) {
  std::mt19937 rng(4);
  for (int trial = 0; trial < 20; ++trial) {
    const ModelProfile p = nested_profile(rng, 12, 4);
    for (int64_t nodes : {int64_t{0}, int64_t{2'000'000}}) {
      ModelSolverOptions options;
      options.max_exact_nodes = nodes;
      const int64_t lowest = min_model_budget(p);  // exact: the search finishes
      const ModelPlan plan = solve_model(p, lowest - 1, options);
      EXPECT_FALSE(plan.feasible);
      EXPECT_TRUE(plan.choice.empty());
      if (nodes > 0) {
        EXPECT_TRUE(plan.exact);
      }
    }
  }
}

// The heuristic alone (no search) against the proven optimum on realistic nested profiles of 15
// to 25 candidates: within 1% of the optimal step time, and feasible whenever a choice is.
// Half of them with plateaus that vary per segment by up to 20%, where the heuristic's dynamic
// program is no longer exact.
TEST(ModelSolverTest, HeuristicIsWithinOnePercentOnNestedProfiles) {
  std::mt19937 rng(5);
  double worst = 0.0;
  int compared = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const ModelProfile p = nested_profile(rng, 15 + trial % 11, 4, trial % 2 ? 0.2 : 0.0);
    const int64_t lowest = min_model_budget(p);
    for (int64_t budget : budgets(rng, lowest, p.plain_peak_bytes())) {
      const ModelPlan exact = solve_model(p, budget);
      if (!exact.exact) continue;
      ModelSolverOptions heuristic;
      heuristic.max_exact_nodes = 0;
      const ModelPlan guess = solve_model(p, budget, heuristic);
      ASSERT_EQ(guess.feasible, exact.feasible) << "trial " << trial << " budget " << budget;
      if (!exact.feasible) continue;
      EXPECT_FALSE(guess.exact);
      EXPECT_LE(guess.prediction.peak_bytes, budget);
      const double gap = guess.prediction.time / exact.prediction.time - 1.0;
      EXPECT_LE(gap, 0.01) << "trial " << trial << " budget " << budget;
      worst = std::max(worst, gap);
      ++compared;
    }
  }
  EXPECT_GT(compared, 150);
  std::cout << "heuristic vs exact on " << compared << " nested profiles: worst gap " << worst * 100
            << "%\n";
}

// On windows that do not nest (a U-Net's skips), the heuristic still finds a choice where one
// exists.
TEST(ModelSolverTest, HeuristicFindsAChoiceOnArbitraryWindows) {
  std::mt19937 rng(6);
  for (int trial = 0; trial < 1000; ++trial) {
    const ModelProfile p = arbitrary_profile(rng, 1 + trial % 10, 4);
    const int64_t lowest = brute_force_min_peak(p, kUnlimited);
    ModelSolverOptions heuristic;
    heuristic.max_exact_nodes = 0;
    for (int64_t budget : budgets(rng, lowest, p.plain_peak_bytes())) {
      const ModelPlan guess = solve_model(p, budget, heuristic);
      EXPECT_EQ(guess.feasible, budget >= lowest) << "trial " << trial << " budget " << budget;
    }
  }
}

}  // namespace
}  // namespace plan
}  // namespace ckpt
