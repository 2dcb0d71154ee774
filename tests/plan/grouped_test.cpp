// Tests of solve_grouped, the optimal solver of long chains: valid schedules within the budget,
// the slot table with one stage per group, and 1000 stages through solve_optimal.

#include <gtest/gtest.h>

#include "plan_support.h"

#include <limits>
#include <random>

#include "ckpt/plan/simulator.h"
#include "ckpt/plan/solvers.h"

namespace ckpt {
namespace plan {
namespace {

using test::random_chain;

// Every budget from the smallest feasible one up to storing everything gets a valid schedule
// within the budget, never slower than the minimum-memory schedule.
TEST(GroupedSolverTest, SchedulesFitEveryFeasibleBudget) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    const Chain chain = random_chain(rng, 40, 1000, trial % 2);
    const int64_t min_budget = min_feasible_budget_bytes(chain);
    const SimulationResult all = simulate(chain, solve_no_checkpoint(chain));
    const double min_memory_time = simulate(chain, solve_min_memory(chain)).time;
    EXPECT_FALSE(solve_grouped(chain, min_budget - 1, 8).has_value());
    for (int step = 0; step <= 8; ++step) {
      const int64_t budget = min_budget + (all.peak_bytes - min_budget) * step / 8;
      const auto schedule = solve_grouped(chain, budget, 8);
      ASSERT_TRUE(schedule.has_value()) << "trial " << trial << ", budget " << budget;
      const SimulationResult result = simulate(chain, *schedule);
      EXPECT_TRUE(result.valid) << result.error;
      EXPECT_LE(result.peak_bytes, budget);
      EXPECT_LE(result.time, min_memory_time);
    }
  }
}

// With one stage per group, grouping changes nothing: the answer is the slot table's, which the
// exact optimum bounds from below.
TEST(GroupedSolverTest, OneStagePerGroupIsTheTable) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 20; ++trial) {
    const Chain chain = random_chain(rng, 12, 1000, 0);
    const int64_t min_budget = min_feasible_budget_bytes(chain);
    const int64_t peak = simulate(chain, solve_no_checkpoint(chain)).peak_bytes;
    const int64_t budget = min_budget + (peak - min_budget) / 3;
    const auto table = OptimalTable(chain, budget).solve(budget);
    const auto grouped = solve_grouped(chain, budget, chain.size());
    const auto exact = solve_exact(chain, budget, std::numeric_limits<int64_t>::max()).schedule;
    ASSERT_TRUE(table.has_value() && grouped.has_value() && exact.has_value());
    EXPECT_DOUBLE_EQ(simulate(chain, *grouped).time, simulate(chain, *table).time)
        << "trial " << trial;
    EXPECT_GE(simulate(chain, *grouped).time, simulate(chain, *exact).time);
  }
}

// Past max_exact_stages, solve_optimal groups: 1000 stages plan in seconds, not minutes.
TEST(GroupedSolverTest, ThousandStagesThroughSolveOptimal) {
  std::mt19937 rng(3);
  const Chain chain = random_chain(rng, 1000, 1 << 20, 0);
  const SimulationResult all = simulate(chain, solve_no_checkpoint(chain));
  const auto everything = solve_optimal(chain, all.peak_bytes);
  ASSERT_TRUE(everything.has_value());
  EXPECT_EQ(simulate(chain, *everything).forward_count, 1000);  // nothing recomputed
  const int64_t budget = all.peak_bytes / 4;
  const auto schedule = solve_optimal(chain, budget);
  ASSERT_TRUE(schedule.has_value());
  const SimulationResult result = simulate(chain, *schedule);
  EXPECT_TRUE(result.valid) << result.error;
  EXPECT_LE(result.peak_bytes, budget);
}

TEST(GroupedSolverTest, RejectsNoGroups) {
  EXPECT_THROW(solve_grouped(homogeneous_chain(4, 1, 1, 8, 8), 1000, 0), std::invalid_argument);
}

}  // namespace
}  // namespace plan
}  // namespace ckpt
