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

#include "model_support.h"

namespace ckpt {
namespace plan {
namespace {

using namespace test;  // the shared profiles and oracles of model_support.h

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

// How an option runs is typed; its name is made from it, never read back (issue 48).
TEST(OptionRunTest, NamesWhatRunsAndNothingParsesIt) {
  EXPECT_EQ(OptionRun::stored().name(), "stored");
  EXPECT_TRUE(OptionRun::stored().mode.empty());
  EXPECT_EQ(OptionRun::in_mode("selective").name(), "selective");
  EXPECT_EQ(OptionRun::in_mode("offloaded", /*takers_kept=*/true).name(), "offloaded, takers kept");
  const OptionRun recomputed = OptionRun::recomputed(3);
  EXPECT_EQ(recomputed.name(), "recomputed, chain of 3");
  EXPECT_EQ(recomputed.mode, "checkpointed");
  EXPECT_TRUE(recomputed.outputs_recomputed);
  EXPECT_EQ(recomputed.chain_length, 3);
  EXPECT_EQ(OptionRun::recomputed(1).name(), "recomputed");
  EXPECT_EQ(OptionRun::recomputed(0).chain_length, 1);
  // A profile written by hand names options as it likes; they run plainly unless `run` says so.
  const CandidateOption labelled{"checkpointed", 1.0, 0, {}};
  EXPECT_TRUE(labelled.run.mode.empty());
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

// The hand profile's backwards: b's in segment 3, a's in segment 4; a offloaded fetches 40 bytes.
ModelProfile with_backwards(ModelProfile p) {
  p.candidates[0].backward_segment = 4;
  p.candidates[1].backward_segment = 3;
  p.candidates[0].options[2].fetched_bytes = 40;
  return p;
}

TEST(ModelLookAheadTest, BringsOffloadedDataBackWhereTheBudgetHasRoomAndCountsIt) {
  const ModelProfile p = with_backwards(hand_profile());
  // a offloaded, b checkpointed: 100 165 160 190 100; a's data back from b's backward: +40 in 3.
  ModelPlan plan;
  plan.feasible = true;
  plan.choice = {2, 1};
  plan.prediction = simulate_model(p, plan.choice);
  ASSERT_EQ(plan.prediction.peak_bytes, 190);
  const ModelPlan tight = add_look_ahead(p, plan, 200);
  EXPECT_TRUE(tight.look_ahead.empty());
  EXPECT_EQ(tight.prediction.peak_bytes, 190);
  const ModelPlan roomy = add_look_ahead(p, plan, 250);
  EXPECT_EQ(roomy.look_ahead, (std::vector<int>{-1, 0}));
  EXPECT_EQ(roomy.prediction.peak_bytes, 230);
  EXPECT_EQ(roomy.prediction.peak_segment, 3);
  EXPECT_EQ(roomy.prediction.time, plan.prediction.time);
  EXPECT_EQ(simulate_model(p, plan.choice, roomy.look_ahead).peak_bytes, 230);
  // Below the plan's own peak, the limit is that peak: a offloaded, b stored peaks at 260 in
  // segment 2, and 160 + 40 in segment 3 stays under it.
  plan.choice = {2, 0};
  plan.prediction = simulate_model(p, plan.choice);
  EXPECT_EQ(add_look_ahead(p, plan, 0).look_ahead, (std::vector<int>{-1, 0}));
  // Nothing offloaded, nothing to bring back.
  plan.choice = {1, 1};
  plan.prediction = simulate_model(p, plan.choice);
  EXPECT_TRUE(add_look_ahead(p, plan, 1000).look_ahead.empty());
  plan.feasible = false;
  EXPECT_TRUE(add_look_ahead(p, plan, 1000).look_ahead.empty());
}

TEST(ModelLookAheadTest, BadLookAheadsAndBackwardsSayWhatIsWrong) {
  ModelProfile p = with_backwards(hand_profile());
  EXPECT_THROWS_WITH(simulate_model(p, {2, 0}, {0}), "the look-ahead has 1 entries for 2");
  EXPECT_THROWS_WITH(simulate_model(p, {2, 0}, {-1, 5}), "brings back candidate 5");
  EXPECT_THROWS_WITH(simulate_model(p, {2, 0}, {-1, 1}), "brings back candidate 1");
  EXPECT_THROWS_WITH(simulate_model(p, {1, 0}, {-1, 0}), "whose chosen option fetches nothing");
  p.candidates[1].options[1].fetched_bytes = 10;
  EXPECT_THROWS_WITH(simulate_model(p, {2, 1}, {1, -1}),
                     "whose backward does not begin after its own");
  p = with_backwards(hand_profile());
  p.candidates[0].backward_segment = 5;
  EXPECT_THROWS_WITH(p.validate(), "backward_segment 5 outside the timeline's 5 segments");
  p = with_backwards(hand_profile());
  p.candidates[0].options[2].fetched_bytes = -1;
  EXPECT_THROWS_WITH(p.validate(), "negative fetched_bytes");
  p = with_backwards(hand_profile());
  p.candidates[0].options[0].fetched_bytes = 1;
  EXPECT_THROWS_WITH(p.validate(), "option 0, the stored mode");
}

// On arbitrary profiles with backwards anywhere: every look-ahead added is valid, brings back the
// candidate whose backward begins next, and the prediction is the plain loads plus its held bytes
// (summed here on their own), within the budget or the plan's own peak; time and host unchanged.
TEST(ModelLookAheadTest, AddedLookAheadsAreValidAndCountedOnArbitraryProfiles) {
  std::mt19937 rng(11);
  int added = 0;
  for (int round = 0; round < 300; ++round) {
    ModelProfile p = arbitrary_profile(rng, 1 + static_cast<int>(rng() % 6), 4);
    const int segments = static_cast<int>(p.segment_peak_bytes.size());
    for (Candidate& c : p.candidates) {
      c.backward_segment = static_cast<int>(rng() % static_cast<unsigned>(segments + 1)) - 1;
      for (size_t o = 1; o < c.options.size(); ++o) {
        if (c.options[o].host_bytes > 0) c.options[o].fetched_bytes = c.options[o].host_bytes;
      }
    }
    ModelPlan plan;
    plan.feasible = true;
    for (const Candidate& c : p.candidates)
      plan.choice.push_back(static_cast<int>(rng() % c.options.size()));
    plan.prediction = simulate_model(p, plan.choice);
    const int64_t budget = plan.prediction.peak_bytes + static_cast<int64_t>(rng() % 8000) - 2000;
    const ModelPlan with = add_look_ahead(p, plan, budget);
    EXPECT_EQ(with.prediction.time, plan.prediction.time);
    EXPECT_EQ(with.prediction.host_bytes, plan.prediction.host_bytes);
    EXPECT_LE(with.prediction.peak_bytes, std::max(budget, plan.prediction.peak_bytes));
    if (with.look_ahead.empty()) continue;
    std::vector<int64_t> load = p.segment_peak_bytes;
    for (size_t c = 0; c < p.candidates.size(); ++c) {
      const CandidateOption& option = p.candidates[c].options[static_cast<size_t>(plan.choice[c])];
      for (size_t i = 0; i < option.peak_delta.size(); ++i)
        load[static_cast<size_t>(p.candidates[c].window_begin) + i] += option.peak_delta[i];
    }
    for (size_t c = 0; c < with.look_ahead.size(); ++c) {
      const int back = with.look_ahead[c];
      if (back < 0) continue;
      ++added;
      const Candidate& lead = p.candidates[c];
      const Candidate& brought = p.candidates[static_cast<size_t>(back)];
      // No candidate's backward begins between the two.
      for (const Candidate& other : p.candidates) {
        EXPECT_FALSE(other.backward_segment > lead.backward_segment &&
                     other.backward_segment < brought.backward_segment);
      }
      const int64_t fetched =
          brought.options[static_cast<size_t>(plan.choice[static_cast<size_t>(back)])]
              .fetched_bytes;
      ASSERT_GT(fetched, 0);
      for (int k = lead.backward_segment; k < brought.backward_segment; ++k)
        load[static_cast<size_t>(k)] += fetched;
    }
    EXPECT_EQ(with.prediction.peak_bytes, *std::max_element(load.begin(), load.end()));
    EXPECT_EQ(simulate_model(p, plan.choice, with.look_ahead).peak_bytes,
              with.prediction.peak_bytes);
  }
  EXPECT_GT(added, 50) << "few look-aheads: the test checks little";
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
  for (double gap : {-0.01, 1.0, std::nan("")}) {
    options = ModelSolverOptions();
    options.relative_gap = gap;
    EXPECT_THROWS_WITH(solve_model(hand_profile(), 300, options), "is outside [0, 1)");
  }
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

// ~~~ Random profiles (model_support.h) ~~~

TEST(ModelSolverTest, MatchesBruteForceOnNestedWindows) {
  sweep_against_brute_force(
      [](std::mt19937& rng, int n, int options) {
        return nested_profile(rng, n, options, n % 2 ? 0.2 : 0.0);
      },
      1, Sweep{60, 10, budgets});
}

TEST(ModelSolverTest, MatchesBruteForceOnArbitraryWindows) {
  sweep_against_brute_force(arbitrary_profile, 2, Sweep{60, 10, budgets});
}

// More candidates, two options each: where the heuristic alone misses the lowest peak, the
// search must find it.
TEST(ModelSolverTest, MinBudgetMatchesBruteForceOnLargerProfiles) {
  std::mt19937 rng(7);
  expect_min_budget_matches_brute_force(40, [&](int trial) {
    const int n = 12 + trial % 7;
    return trial % 2 ? nested_profile(rng, n, 2, 0.2) : arbitrary_profile(rng, n, 2);
  });
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

// Whatever the node limit, what a plan says it proved holds against the brute force: exact
// means the fastest, and a finite gap g means at most (1 + g) times the fastest step. The
// searches within the gap are reached (the exact one stops at its limit, the second finishes).
TEST(ModelSolverTest, ProvenGapHoldsAgainstBruteForce) {
  std::mt19937 rng(8);
  int within_gap = 0, bounded = 0;
  for (int trial = 0; trial < 120; ++trial) {
    const int n = 5 + trial % 4;
    const ModelProfile p =
        trial % 2 ? arbitrary_profile(rng, n, 4) : nested_profile(rng, n, 4, 0.2);
    const int64_t lowest = brute_force_min_peak(p, kUnlimited);
    for (int64_t budget : budgets(rng, lowest, p.plain_peak_bytes())) {
      const ModelPlan oracle = solve_model_brute_force(p, budget);
      for (int64_t nodes : {0, 2, 8, 30, 25'000}) {
        for (double gap : {0.01, 0.3}) {
          ModelSolverOptions options;
          options.max_exact_nodes = nodes;
          options.relative_gap = gap;
          const ModelPlan plan = solve_model(p, budget, options);
          const std::string at = "trial " + std::to_string(trial) + " budget " +
                                 std::to_string(budget) + " nodes " + std::to_string(nodes);
          if (!plan.feasible) continue;  // the heuristic may miss where the search can't help
          if (nodes == 0) {
            EXPECT_TRUE(std::isinf(plan.gap)) << at;
          }
          if (plan.exact) {
            EXPECT_EQ(plan.gap, 0.0) << at;
            EXPECT_EQ(plan.prediction.time, oracle.prediction.time) << at;
          }
          if (!std::isfinite(plan.gap)) continue;
          ++bounded;
          within_gap += !plan.exact && plan.gap > 0.0;
          EXPECT_LE(plan.prediction.time, (1.0 + plan.gap) * oracle.prediction.time * (1 + 1e-12))
              << at << " gap " << plan.gap;
        }
      }
    }
  }
  EXPECT_GT(within_gap, 0) << "no plan was bounded by the search within the gap";
  std::cout << bounded << " plans with a proven gap, " << within_gap << " not exact\n";
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
