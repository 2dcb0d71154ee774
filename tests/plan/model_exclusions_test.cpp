// Exclusions between options in the model of any network (ckpt/plan/model.h): the profile's
// checks, the simulator's error, solve_model and min_model_budget against enumerating every valid
// choice, and the heuristic alone (always valid, and how far from the optimum).

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "ckpt/plan/model.h"
#include "model_support.h"

namespace ckpt {
namespace plan {
namespace {

using namespace test;  // the shared profiles and oracles of model_support.h

TEST(ModelExclusionsTest, ValidateSaysWhatIsWrongWithAnExclusion) {
  ModelProfile p = hand_profile();
  p.candidates[0].options[1].excludes = {{2, 0}};
  EXPECT_THROWS_WITH(p.validate(),
                     "option 1 ('checkpointed') excludes candidate 2, but the "
                     "profile has 2 candidates");
  p.candidates[0].options[1].excludes = {{-1, 0}};
  EXPECT_THROWS_WITH(p.validate(), "excludes candidate -1");
  p.candidates[0].options[1].excludes = {{0, 2}};
  EXPECT_THROWS_WITH(p.validate(), "excludes an option of its own candidate");
  p.candidates[0].options[1].excludes = {{1, 2}};
  EXPECT_THROWS_WITH(p.validate(), "excludes option 2 of candidate 1 ('b'), which has 2 options");
  p.candidates[0].options[1].excludes = {{1, -1}};
  EXPECT_THROWS_WITH(p.validate(), "excludes option -1 of candidate 1 ('b')");
  p.candidates[0].options[1].excludes = {};
  p.candidates[1].options[0].excludes = {{0, 1}};
  EXPECT_THROWS_WITH(p.validate(), "candidate 1 ('b') option 0 ('stored') is option 0");
  // Another option may exclude option 0, on either side.
  p.candidates[1].options[0].excludes = {};
  p.candidates[1].options[1].excludes = {{0, 0}};
  p.candidates[0].options[2].excludes = {{1, 1}};
  EXPECT_NO_THROW(p.validate());
}

TEST(ModelExclusionsTest, SimulateNamesTheFirstViolatedPair) {
  ModelProfile p = hand_profile();
  p.candidates[1].options[1].excludes = {{0, 2}};  // listed on b's side only
  EXPECT_THROWS_WITH(simulate_model(p, {2, 1}),
                     "candidate 1 ('b') option 1 ('checkpointed') excludes candidate 0 ('a') "
                     "option 2 ('offloaded'), but the choice picks both");
  EXPECT_NO_THROW(simulate_model(p, {1, 1}));
  EXPECT_NO_THROW(simulate_model(p, {2, 0}));
  // Two violated pairs: the one a lists comes first.
  p.candidates[0].options[2].excludes = {{1, 1}};
  EXPECT_THROWS_WITH(simulate_model(p, {2, 1}),
                     "candidate 0 ('a') option 2 ('offloaded') excludes");
  // An option that excludes another candidate's option 0.
  p.candidates[0].options[1].excludes = {{1, 0}};
  EXPECT_THROWS_WITH(simulate_model(p, {1, 0}), "excludes candidate 1 ('b') option 0 ('stored')");
}

// The hand profile's best choices, once excluded, give way to the next best valid ones.
TEST(ModelExclusionsTest, HandExample) {
  ModelProfile p = hand_profile();
  // a offloaded needs b checkpointed: (2, 0) is out, (2, 1) costs 1.25 s; (0, 1) is faster.
  p.candidates[0].options[2].excludes = {{1, 0}};
  for (int64_t nodes : {int64_t{0}, int64_t{2'000'000}}) {
    ModelSolverOptions options;
    options.max_exact_nodes = nodes;
    const ModelPlan plan = solve_model(p, 260, options);
    EXPECT_EQ(plan.choice, (std::vector<int>{0, 1})) << nodes << " nodes";
    EXPECT_EQ(plan.prediction.time, 10.75);
  }
  EXPECT_EQ(solve_model_brute_force(p, 260).choice, (std::vector<int>{0, 1}));
  EXPECT_EQ(solve_model(p, 200).choice, (std::vector<int>{2, 1}));  // peak 190
  // Both checkpointed (peak 180) excluded: the lowest peak is a offloaded, b checkpointed.
  p.candidates[1].options[1].excludes = {{0, 1}};
  EXPECT_EQ(min_model_budget(p), 190);
  EXPECT_EQ(solve_model_brute_force(p, 189).feasible, false);
  EXPECT_FALSE(solve_model(p, 189).feasible);
}

// Without segments (memory never binds): a's faster option needs b off "stored", and b's slow
// option costs less than a's saves, so the fastest choice takes both; the heuristic too.
TEST(ModelExclusionsTest, ChoosesAnOptionWithTheOneItForces) {
  ModelProfile p;
  p.candidates.push_back(
      Candidate{"a", 0, {{"stored", 2.0, 0, {}}, {"fast", 1.0, 0, {}, {OptionRef{1, 0}}}}});
  p.candidates.push_back(
      Candidate{"b", 0, {{"stored", 1.0, 0, {}}, {"slow", 1.5, 0, {}}, {"slower", 3.0, 0, {}}}});
  for (int64_t nodes : {int64_t{0}, int64_t{2'000'000}}) {
    ModelSolverOptions options;
    options.max_exact_nodes = nodes;
    EXPECT_EQ(solve_model(p, 0, options).choice, (std::vector<int>{1, 1})) << nodes << " nodes";
    EXPECT_EQ(min_model_budget(p, options), 0);
  }
  EXPECT_EQ(solve_model_brute_force(p, 0).choice, (std::vector<int>{1, 1}));
}

// ~~~ Random profiles with exclusions ~~~

// "Recomputed", as the profiler offers it: on about a third of the candidates (those with a
// consumer), an option that keeps what checkpointed keeps less the consumer's input, at the cost
// of one more forward. It excludes every option but "checkpointed" (option 1) of the next 1-3
// candidates (its consumers), and "recomputed" of 1-2 earlier ones (its inputs' producers).
ModelProfile with_recomputed(std::mt19937& rng, ModelProfile p) {
  const int n = static_cast<int>(p.candidates.size());
  std::vector<int> recomputed(static_cast<size_t>(n), -1);  // its option index, or -1
  std::uniform_int_distribution<int> consumers(1, 3), producers(1, 2);
  for (int i = 0; i + 1 < n; ++i) {
    if (rng() % 3 != 0) continue;
    Candidate& c = p.candidates[i];
    const Candidate& next = p.candidates[i + 1];
    CandidateOption option = c.options[1];
    option.name = "recomputed";
    option.time += c.options[0].time / 3;  // one more forward (stored is three of them)
    const std::vector<int64_t>& inner = next.options[1].peak_delta;  // next's checkpointed
    const int64_t input = inner.size() > 2 ? -inner[1] / 3 : 0;      // what next keeps
    for (size_t k = 1; k + 1 < inner.size(); ++k) option.peak_delta[k + 1] -= input;
    for (int j = i + 1, end = std::min(n, i + 1 + consumers(rng)); j < end; ++j) {
      for (int o = 0; o < static_cast<int>(p.candidates[j].options.size()); ++o) {
        if (o != 1) option.excludes.push_back({j, o});
      }
    }
    option.peak_delta[inner.size()] += input;  // recomputed in the consumer's backward
    for (int j = i - 1, left = producers(rng); j >= 0 && left > 0; --j) {
      if (recomputed[j] < 0) continue;
      option.excludes.push_back({j, recomputed[j]});
      --left;
    }
    recomputed[i] = static_cast<int>(c.options.size());
    c.options.push_back(option);
  }
  return p;
}

// Exclusions anywhere: each option but 0 lists up to two options of other candidates, 0
// included. On every other profile a chain: option 1 of each candidate leaves the next one only
// its option 1, so that choosing it once forces it on every later candidate.
ModelProfile with_random_exclusions(std::mt19937& rng, ModelProfile p) {
  const int n = static_cast<int>(p.candidates.size());
  const bool chain = rng() % 2 == 0;
  for (int c = 0; c < n; ++c) {
    std::vector<CandidateOption>& options = p.candidates[c].options;
    for (size_t o = 1; o < options.size(); ++o) {
      for (int k = static_cast<int>(rng() % 3); k > 0 && n > 1; --k) {
        const int d = (c + 1 + static_cast<int>(rng() % static_cast<unsigned>(n - 1))) % n;
        const int m = static_cast<int>(rng() % p.candidates[d].options.size());
        options[o].excludes.push_back({d, m});
      }
    }
    if (!chain || c + 1 == n) continue;
    for (int m = 0; m < static_cast<int>(p.candidates[c + 1].options.size()); ++m) {
      if (m != 1) options[1].excludes.push_back({c + 1, m});
    }
  }
  return p;
}

ModelProfile recomputed_nested(std::mt19937& rng, int n, int options) {
  return with_recomputed(rng, nested_profile(rng, n, options, n % 2 ? 0.2 : 0.0));
}

ModelProfile excluding_arbitrary(std::mt19937& rng, int n, int options) {
  return with_random_exclusions(rng, arbitrary_profile(rng, n, options));
}

// Budgets near the lowest peak (where exclusions bite), and the plain peak.
std::vector<int64_t> tight_budgets(std::mt19937& rng, int64_t lowest, int64_t plain) {
  std::vector<int64_t> out = budgets(rng, lowest, plain);
  const int64_t span = std::max<int64_t>(1, (plain - lowest) / 10);
  out.push_back(lowest + 1);
  out.push_back(lowest + std::uniform_int_distribution<int64_t>(0, span)(rng));
  return out;
}

// The solvers against the brute force on profiles with exclusions, at budgets near the lowest.
void sweep_with_exclusions(const std::function<ModelProfile(std::mt19937&, int, int)>& make,
                           unsigned seed) {
  sweep_against_brute_force(make, seed, Sweep{80, 9, tight_budgets});
}

TEST(ModelExclusionsTest, MatchesBruteForceWithRecomputedOptions) {
  sweep_with_exclusions(recomputed_nested, 11);
}

TEST(ModelExclusionsTest, MatchesBruteForceWithArbitraryExclusions) {
  sweep_with_exclusions(excluding_arbitrary, 12);
}

// min_model_budget on larger profiles, two options and "recomputed" on some: the search must
// respect exclusions where the heuristic's guess does not settle the answer.
TEST(ModelExclusionsTest, MinBudgetMatchesBruteForceOnLargerProfiles) {
  std::mt19937 rng(13);
  expect_min_budget_matches_brute_force(30, [&](int trial) {
    const int n = 10 + trial % 5;
    return trial % 2 ? recomputed_nested(rng, n, 2) : excluding_arbitrary(rng, n, 2);
  });
}

// The heuristic alone (or a search cut short) always answers a valid choice within the budgets,
// and solves the budget its min_model_budget answers. How often it misses a feasible budget and
// how far it is from the optimal step time are printed.
TEST(ModelExclusionsTest, HeuristicChoiceIsAlwaysValid) {
  std::mt19937 rng(14);
  double worst = 0.0, sum = 0.0;
  int compared = 0, missed = 0, within = 0;
  for (int trial = 0; trial < 600; ++trial) {
    const int n = 1 + trial % 9;
    const ModelProfile p =
        trial % 2 ? recomputed_nested(rng, n, n > 7 ? 3 : 4) : excluding_arbitrary(rng, n, 4);
    const int64_t host = trial % 3 ? kUnlimited : total_host(p) / 3;
    ModelSolverOptions heuristic;
    heuristic.host_budget_bytes = host;
    heuristic.max_exact_nodes = trial % 4 ? 0 : 3;
    const int64_t lowest = brute_force_min_peak(p, host), guessed = min_model_budget(p, heuristic);
    EXPECT_GE(guessed, lowest);
    std::vector<int64_t> tries = tight_budgets(rng, lowest, p.plain_peak_bytes());
    tries.push_back(guessed);
    for (int64_t budget : tries) {
      const ModelPlan guess = solve_model(p, budget, heuristic);
      const ModelPlan oracle = solve_model_brute_force(p, budget, host);
      EXPECT_TRUE(guess.feasible || budget != guessed) << "trial " << trial;
      missed += oracle.feasible && !guess.feasible;
      if (!guess.feasible) continue;
      ASSERT_TRUE(valid(p, guess.choice)) << "trial " << trial << " budget " << budget;
      EXPECT_LE(guess.prediction.peak_bytes, budget);
      EXPECT_LE(guess.prediction.host_bytes, host);
      const double gap = guess.prediction.time / oracle.prediction.time - 1.0;
      worst = std::max(worst, gap);
      sum += gap;
      within += gap <= 0.01;
      ++compared;
    }
  }
  std::cout << "heuristic vs brute force with exclusions, 600 small profiles, " << compared + missed
            << " feasible budgets: " << missed << " missed, worst gap " << worst * 100 << "%, mean "
            << sum / compared * 100 << "%, " << within << " within 1%\n";
}

// The heuristic alone against the proven optimum on nested profiles of 15 to 25 candidates with
// "recomputed" options: always valid, within the budget and within 1% of the optimal step time
// where it answers; how often it misses a feasible budget (near the lowest) is printed.
TEST(ModelExclusionsTest, HeuristicAgainstExactWithRecomputedOptions) {
  std::mt19937 rng(15);
  double worst = 0.0, sum = 0.0;
  int compared = 0, missed = 0, within = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const ModelProfile p =
        with_recomputed(rng, nested_profile(rng, 15 + trial % 11, 4, trial % 2 ? 0.2 : 0.0));
    const int64_t lowest = min_model_budget(p);
    for (int64_t budget : budgets(rng, lowest, p.plain_peak_bytes())) {
      const ModelPlan exact = solve_model(p, budget);
      if (!exact.exact || !exact.feasible) continue;
      ModelSolverOptions heuristic;
      heuristic.max_exact_nodes = 0;
      const ModelPlan guess = solve_model(p, budget, heuristic);
      missed += !guess.feasible;
      if (!guess.feasible) continue;
      ASSERT_TRUE(valid(p, guess.choice)) << "trial " << trial << " budget " << budget;
      EXPECT_LE(guess.prediction.peak_bytes, budget);
      const double gap = guess.prediction.time / exact.prediction.time - 1.0;
      EXPECT_LE(gap, 0.01) << "trial " << trial << " budget " << budget;
      worst = std::max(worst, gap);
      sum += gap;
      within += gap <= 0.01;
      ++compared;
    }
  }
  EXPECT_GT(compared, 150);
  std::cout << "heuristic vs exact with recomputed options, 40 nested profiles, "
            << compared + missed << " feasible budgets: " << missed << " missed, worst gap "
            << worst * 100 << "%, mean " << sum / compared * 100 << "%, " << within
            << " within 1%\n";
}

}  // namespace
}  // namespace plan
}  // namespace ckpt
