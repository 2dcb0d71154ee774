// The planner at the byte-exact optimum: solve_exact against the brute force over persistent
// schedules, and solve_optimal (exact, refined table or storing everything) against solve_exact,
// on random chains whose sizes are arbitrary byte counts. Every schedule is scored with the
// tests' own accounting (reference_accounting.h), not the solver's simulate().

#include <gtest/gtest.h>

#include "brute_force.h"
#include "plan_support.h"
#include "reference_accounting.h"

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "ckpt/plan/simulator.h"
#include "ckpt/plan/solvers.h"

namespace ckpt {
namespace plan {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();
constexpr int64_t kUnlimited = std::numeric_limits<int64_t>::max();

test::ReferenceScore score(const Chain& chain, const Schedule& schedule) {
  return test::ReferenceAccounting(chain).score(schedule);
}

// Sizes of 1 byte to 8 MiB, not multiples of anything: every rounding shows. Integer times, so
// that sums in any order are exact; about two thirds of the stages take longer with grad enabled.
Chain random_byte_chain(std::mt19937& rng, int stages, int alternatives) {
  Chain chain = test::random_chain(rng, stages, 8 << 20, alternatives);
  std::uniform_int_distribution<int> extra(0, 2);
  for (Stage& stage : chain.stages) {
    const int more = extra(rng);
    if (more > 0) stage.forward_all_time = stage.forward_time + more;
  }
  return chain;
}

// The same with times that do not sum exactly either.
Chain random_real_chain(std::mt19937& rng, int stages, int alternatives) {
  Chain chain = random_byte_chain(rng, stages, alternatives);
  std::uniform_real_distribution<double> jitter(0.8, 1.25);
  for (Stage& stage : chain.stages) {
    stage.forward_time *= jitter(rng);
    stage.backward_time *= jitter(rng);
  }
  return chain;
}

// Budgets from the smallest feasible one to the plain chain's peak, denser near the smallest.
std::vector<int64_t> budget_sweep(const Chain& chain) {
  const int64_t smallest = min_feasible_budget_bytes(chain);
  const int64_t plain = simulate(chain, solve_no_checkpoint(chain)).peak_bytes;
  std::vector<int64_t> budgets;
  for (int64_t step = 0; step <= 9; ++step) {
    budgets.push_back(smallest + (plain - smallest) * step * step / 81);
  }
  return budgets;
}

// solve_optimal's schedule against the exact optimum: it fits, and is at most `tolerance` slower.
// Returns the gap.
double expect_near_optimum(const Chain& chain, int64_t budget, const OptimalOptions& options,
                           double tolerance) {
  const ExactSolution exact = solve_exact(chain, budget, kUnlimited);
  EXPECT_TRUE(exact.schedule.has_value());
  const auto schedule = solve_optimal(chain, budget, options);
  EXPECT_TRUE(schedule.has_value());
  if (!exact.schedule || !schedule) return 0.0;
  const double optimum = score(chain, *exact.schedule).time;
  const test::ReferenceScore result = score(chain, *schedule);
  EXPECT_TRUE(result.valid);
  EXPECT_LE(result.peak_bytes, budget);
  EXPECT_LE(result.time, optimum * (1 + tolerance))
      << chain.size() << " stages, budget " << budget << ", optimum " << optimum;
  EXPECT_GE(result.time, optimum * (1 - 1e-12));
  return result.time / optimum - 1;
}

// Budgets where the optimum changes: each schedule's peak and one byte below it.
std::vector<int64_t> thresholds(const std::vector<test::Scored>& all) {
  std::set<int64_t> budgets;
  for (const test::Scored& s : all) {
    budgets.insert(s.peak_bytes);
    budgets.insert(s.peak_bytes - 1);
  }
  return {budgets.begin(), budgets.end()};
}

TEST(ExactSolverTest, EqualsBruteForceAtEveryThresholdInBytes) {
  std::mt19937 rng(2026);
  int pairs = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const int stages = 1 + trial % 5;
    const int alternatives = trial % 3 == 2 ? 1 : 0;
    OptimalOptions options;
    options.forward_all_only_before_backward = trial % 7 == 3;
    const Chain chain = random_byte_chain(rng, stages, alternatives);
    const std::vector<test::Scored> all =
        test::score_persistent_schedules(chain, options.forward_all_only_before_backward);
    for (const int64_t budget : thresholds(all)) {
      if (budget < chain.input_bytes) continue;
      const double expected = test::fastest_within(all, budget);
      const ExactSolution solution = solve_exact(chain, budget, kUnlimited, options);
      ++pairs;
      ASSERT_EQ(solution.schedule.has_value(), expected < kInfinity) << "budget " << budget;
      EXPECT_EQ(solution.status, expected < kInfinity ? ExactSolution::Status::Solved
                                                      : ExactSolution::Status::Infeasible);
      if (!solution.schedule) continue;
      const test::ReferenceScore result = score(chain, *solution.schedule);
      ASSERT_TRUE(result.valid) << to_string(*solution.schedule);
      EXPECT_LE(result.peak_bytes, budget);
      EXPECT_EQ(result.time, expected) << "budget " << budget << "\n"
                                       << to_string(*solution.schedule);
    }
  }
  EXPECT_GE(pairs, 1000);
}

// solve_optimal within 0.5% of the byte-exact optimum (solve_exact, checked above): exact where
// the exact program finishes within its work limit, the refined table or storing everything
// elsewhere. The chains of 40 stages take the refined table at most budgets.
TEST(ExactSolverTest, SolveOptimalIsWithinHalfAPercentOfTheExactOptimum) {
  std::mt19937 rng(7);
  int pairs = 0;
  double worst_gap = 0.0;
  for (int trial = 0; trial < 104; ++trial) {
    const int stages = trial < 100 ? 6 + trial % 19 : 40;
    const Chain chain = random_real_chain(rng, stages, trial % 4 == 3 ? 1 : 0);
    for (const int64_t budget : budget_sweep(chain)) {
      worst_gap = std::max(worst_gap, expect_near_optimum(chain, budget, {}, 0.005));
      ++pairs;
    }
  }
  EXPECT_GE(pairs, 1000);
  std::cout << "worst gap to the exact optimum over " << pairs << " pairs: " << 100 * worst_gap
            << "%\n";
}

// The repro: two stages {f 1, b 2, output 3, saved 7}, input 3, budget 23. Storing
// everything peaks at 23 and takes 6; the 500-slot table alone answered 7.
TEST(ExactSolverTest, StoresEverythingWheneverItFits) {
  Chain chain;
  chain.input_bytes = 3;
  chain.stages.assign(2, Stage{1.0, 2.0, 3, 7, 0, 0, {}});
  const int64_t plain = simulate(chain, solve_no_checkpoint(chain)).peak_bytes;
  ASSERT_EQ(plain, 23);
  const auto schedule = solve_optimal(chain, plain);
  ASSERT_TRUE(schedule.has_value());
  EXPECT_EQ(*schedule, solve_no_checkpoint(chain));
}

// Eight identical stages, sizes of 3 units, budgets from the smallest feasible to storing
// everything: solve_optimal equals the exact optimum at every one (the table rounded to 500
// slots alone was up to 37% slower here).
TEST(ExactSolverTest, HomogeneousChainIsExactAtEveryBudget) {
  const Chain chain = homogeneous_chain(8, 1.0, 2.0, 3, 6);
  const int64_t plain = simulate(chain, solve_no_checkpoint(chain)).peak_bytes;
  for (int64_t budget = min_feasible_budget_bytes(chain); budget <= plain; ++budget) {
    const auto schedule = solve_optimal(chain, budget);
    const ExactSolution exact = solve_exact(chain, budget, kUnlimited);
    ASSERT_TRUE(schedule.has_value() && exact.schedule.has_value());
    EXPECT_EQ(score(chain, *schedule).time, score(chain, *exact.schedule).time)
        << "budget " << budget;
  }
}

TEST(ExactSolverTest, StopsAtTheWorkLimitAndSaysSo) {
  std::mt19937 rng(3);
  const Chain chain = random_byte_chain(rng, 40, 0);
  const int64_t plain = simulate(chain, solve_no_checkpoint(chain)).peak_bytes;
  const ExactSolution stopped = solve_exact(chain, plain, 1000);
  EXPECT_EQ(stopped.status, ExactSolution::Status::OverWorkLimit);
  EXPECT_FALSE(stopped.schedule.has_value());
  const ExactSolution below = solve_exact(chain, min_feasible_budget_bytes(chain) - 1, kUnlimited);
  EXPECT_EQ(below.status, ExactSolution::Status::Infeasible);
}

}  // namespace
}  // namespace plan
}  // namespace ckpt
