// Tests of the optimal persistent DP (OptimalTable, solve_optimal, min_feasible_budget_bytes):
// brute force over all persistent schedules, budgets, monotonicity, limits, errors.

#include <gtest/gtest.h>

#include "brute_force.h"
#include "plan_support.h"
#include "reference_accounting.h"

#include <algorithm>
#include <limits>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/plan/simulator.h"
#include "ckpt/plan/solvers.h"

namespace ckpt {
namespace plan {
namespace {

using test::random_chain;

double total_time(const Chain& chain) {
  double total = 0.0;
  for (const Stage& stage : chain.stages) total += stage.forward_time + stage.backward_time;
  return total;
}

struct BruteForceCase {
  int stages;
  int alternatives;
  bool restricted;
};

class OptimalBruteForceTest : public ::testing::TestWithParam<BruteForceCase> {};

TEST_P(OptimalBruteForceTest, EqualsBruteForceOverPersistentSchedules) {
  const BruteForceCase param = GetParam();
  std::mt19937 rng(static_cast<unsigned>(1000 * param.stages + 10 * param.alternatives +
                                         (param.restricted ? 1 : 0)));
  OptimalOptions options;
  options.forward_all_only_before_backward = param.restricted;
  for (int trial = 0; trial < 4; ++trial) {
    const Chain chain = random_chain(rng, param.stages, 12, param.alternatives);
    const std::vector<test::Scored> all = test::score_persistent_schedules(chain, param.restricted);
    int64_t min_peak = std::numeric_limits<int64_t>::max();
    int64_t max_peak = 0;
    for (const test::Scored& s : all) {
      min_peak = std::min(min_peak, s.peak_bytes);
      max_peak = std::max(max_peak, s.peak_bytes);
    }
    EXPECT_EQ(min_feasible_budget_bytes(chain, options), min_peak);
    // One slot per byte: the table is exact, so it must equal the brute force everywhere.
    const int64_t max_budget = max_peak + 1;
    options.slots = static_cast<int>(max_budget);
    const OptimalTable table(chain, max_budget, options);
    EXPECT_EQ(table.min_feasible_budget_bytes(), min_peak);
    for (int64_t budget = chain.input_bytes; budget <= max_budget; ++budget) {
      const double expected = test::fastest_within(all, budget);
      EXPECT_EQ(table.time(budget), expected) << "budget=" << budget;
      const auto schedule = table.solve(budget);
      ASSERT_EQ(schedule.has_value(), expected < std::numeric_limits<double>::infinity())
          << "budget=" << budget;
      if (!schedule) continue;
      const test::ReferenceScore result = test::ReferenceAccounting(chain).score(*schedule);
      ASSERT_TRUE(result.valid) << to_string(*schedule);
      EXPECT_LE(result.peak_bytes, budget);
      EXPECT_EQ(result.time, expected) << "budget=" << budget << "\n" << to_string(*schedule);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Sweep, OptimalBruteForceTest,
                         ::testing::Values(BruteForceCase{1, 0, false}, BruteForceCase{2, 0, false},
                                           BruteForceCase{3, 0, false}, BruteForceCase{4, 0, false},
                                           BruteForceCase{5, 0, false}, BruteForceCase{6, 0, false},
                                           BruteForceCase{3, 1, false}, BruteForceCase{4, 1, false},
                                           BruteForceCase{5, 1, false}, BruteForceCase{4, 0, true},
                                           BruteForceCase{6, 0, true}, BruteForceCase{4, 1, true}),
                         [](const ::testing::TestParamInfo<BruteForceCase>& param_info) {
                           return "Stages" + std::to_string(param_info.param.stages) +
                                  "Alternatives" + std::to_string(param_info.param.alternatives) +
                                  (param_info.param.restricted ? "Restricted" : "");
                         });

// `--slots 20000000` on 8 stages once took 35 s and 7.2 GB: now refused before allocating.
TEST(OptimalSolverTest, RefusesTablesAboveTheLimitBeforeAllocating) {
  const Chain chain = homogeneous_chain(8, 1.0, 2.0, 100, 100);
  // The min-max program's entries (48 bytes each, (L+1)(L+2)/2 of them when dense) and the table.
  EXPECT_EQ(optimal_table_bytes(8), 9 * 10 / 2 * 48 + 9 * 10 / 2 * 501 * 8);
  OptimalOptions grouped;
  grouped.slots = 100;
  grouped.max_truncated_pairs = std::numeric_limits<int64_t>::max();  // dense: 176 bytes an entry
  EXPECT_EQ(optimal_table_bytes(1000, grouped),
            int64_t{1001} * 1002 / 2 * (48 + 176) + 129 * 130 / 2 * 101 * 8);
  OptimalOptions options;
  options.slots = 20000000;
  try {
    OptimalTable table(chain, 10000, options);
    ADD_FAILURE() << "expected std::length_error";
  } catch (const std::length_error& error) {
    EXPECT_NE(std::string(error.what()).find("8 stages with 20000000 slots needs 7200 MB"),
              std::string::npos)
        << error.what();
  }
  options.slots = 500;
  options.max_table_bytes = 1000;
  EXPECT_THROW(min_feasible_budget_bytes(chain, options), std::length_error);
  EXPECT_THROW(solve_min_memory(chain, options), std::length_error);
  options.max_table_bytes = optimal_table_bytes(8, options);
  EXPECT_TRUE(solve_optimal(chain, 10000, options).has_value());
}

TEST(OptimalSolverTest, MinMemoryScheduleReachesTheMinimum) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 30; ++trial) {
    const Chain chain = random_chain(rng, 1 + trial % 20, 1 << 20, trial % 2);
    const Schedule schedule = solve_min_memory(chain);
    const SimulationResult result = simulate(chain, schedule);
    ASSERT_TRUE(result.valid) << result.error;
    EXPECT_EQ(result.peak_bytes, min_feasible_budget_bytes(chain));
  }
}

// Budgets from below the minimum to above the no-checkpoint peak, 500 slots (sizes rounded).
TEST(OptimalSolverTest, PeakNeverExceedsBudget) {
  std::mt19937 rng(42);
  for (int trial = 0; trial < 24; ++trial) {
    const int stages = 2 + trial % 23;
    const int alternatives = trial % 3 == 2 ? 1 : 0;
    const Chain chain = random_chain(rng, stages, 1 << 20, alternatives);
    const int64_t bottom = min_feasible_budget_bytes(chain);
    const int64_t top = simulate(chain, solve_no_checkpoint(chain)).peak_bytes;
    EXPECT_LE(bottom, top);
    for (int step = -2; step <= 24; ++step) {
      const int64_t budget = std::max(chain.input_bytes, bottom + (top - bottom) * step / 20);
      const auto schedule = solve_optimal(chain, budget);
      ASSERT_EQ(schedule.has_value(), budget >= bottom) << "budget=" << budget;
      if (!schedule) continue;
      const SimulationResult result = simulate(chain, *schedule);
      ASSERT_TRUE(result.valid) << result.error;
      EXPECT_LE(result.peak_bytes, budget) << "stages=" << stages << " step=" << step;
      if (alternatives == 0) {
        EXPECT_GE(result.time, total_time(chain));
      }
    }
  }
}

// Chains whose executor keeps random state (docs/memory-model.md, "Random state"), which the
// programs leave out: every answer still fits when simulated with it, and the smallest budget is
// the minimum-memory schedule's simulated peak, at which a schedule is found.
TEST(OptimalSolverTest, RandomStateAndBufferCopiesKeepEveryPlanWithinItsBudget) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 16; ++trial) {
    Chain chain = random_chain(rng, 2 + trial % 15, 1 << 16, trial % 2);
    chain.random_state_bytes = trial % 4 == 3 ? 0 : 5056;
    for (size_t i = 0; i < chain.stages.size(); i += 3) {
      chain.stages[i].random_state_bytes = chain.random_state_bytes;
    }
    for (size_t i = 1; i < chain.stages.size(); i += 2) {
      chain.stages[i].buffer_bytes = 264 * static_cast<int64_t>(1 + i % 5);
    }
    const int64_t bottom = min_feasible_budget_bytes(chain);
    EXPECT_EQ(bottom, simulate(chain, solve_min_memory(chain)).peak_bytes);
    const int64_t top = simulate(chain, solve_no_checkpoint(chain)).peak_bytes;
    for (int step = -1; step <= 12; ++step) {
      const int64_t budget = std::max(chain.input_bytes, bottom + (top - bottom) * step / 10);
      const auto schedule = solve_optimal(chain, budget);
      ASSERT_EQ(schedule.has_value(), budget >= bottom) << "budget=" << budget;
      if (!schedule) continue;
      const SimulationResult result = simulate(chain, *schedule);
      ASSERT_TRUE(result.valid) << result.error;
      EXPECT_LE(result.peak_bytes, budget) << "trial=" << trial << " step=" << step;
    }
  }
}

TEST(OptimalSolverTest, LargerBudgetIsNeverSlower) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 10; ++trial) {
    const Chain chain = random_chain(rng, 8 + trial * 3, 1 << 16, trial % 2);
    const int64_t top = simulate(chain, solve_no_checkpoint(chain)).peak_bytes;
    const OptimalTable table(chain, top);
    double previous = std::numeric_limits<double>::infinity();
    for (int64_t budget = chain.input_bytes; budget <= top;
         budget += std::max<int64_t>(1, top / 997)) {
      const double time = table.time(budget);
      EXPECT_LE(time, previous) << "budget=" << budget;
      previous = time;
      if (auto schedule = table.solve(budget)) {
        const SimulationResult result = simulate(chain, *schedule);
        ASSERT_TRUE(result.valid) << result.error;
        EXPECT_LE(result.peak_bytes, budget);
        EXPECT_EQ(result.time, time);
      } else {
        EXPECT_EQ(time, std::numeric_limits<double>::infinity());
        EXPECT_LT(budget, table.min_feasible_budget_bytes());
      }
    }
  }
}

TEST(OptimalSolverTest, UnlimitedBudgetRecomputesNothing) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 10; ++trial) {
    const Chain chain = random_chain(rng, 1 + trial * 7, 1 << 20, 0);
    const int64_t top = simulate(chain, solve_no_checkpoint(chain)).peak_bytes;
    for (int64_t budget : {top * 2, top * 10}) {
      const auto schedule = solve_optimal(chain, budget);
      ASSERT_TRUE(schedule.has_value());
      const SimulationResult result = simulate(chain, *schedule);
      EXPECT_EQ(result.time, total_time(chain));
      EXPECT_EQ(result.forward_count, chain.size());
    }
  }
}

TEST(OptimalSolverTest, NeverSlowerThanUniformAtItsPeak) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 6; ++trial) {
    const Chain chain = random_chain(rng, 6 + 2 * trial, 64, 0);
    const int64_t top = simulate(chain, solve_no_checkpoint(chain)).peak_bytes;
    OptimalOptions exact;
    exact.slots = static_cast<int>(top);  // one slot per byte
    const OptimalTable table(chain, top, exact);
    for (int segments = 1; segments <= chain.size(); ++segments) {
      const SimulationResult uniform = simulate(chain, solve_uniform(chain, segments));
      EXPECT_LE(table.time(uniform.peak_bytes), uniform.time) << "segments=" << segments;
    }
  }
}

TEST(OptimalSolverTest, UsesCheaperAlternativeWhenMemoryIsTight) {
  // Stage 1 can keep 100 bytes (option 0) or 20 bytes for a slower backward (option 1).
  Chain chain;
  chain.input_bytes = 10;
  chain.stages.push_back(Stage{1.0, 1.0, 10, 10, 0, 0, {}});
  chain.stages.push_back(Stage{1.0, 1.0, 10, 100, 0, 0, {StorageOption{1.0, 2.0, 20, 0, 0, {}}}});
  chain.stages.push_back(Stage{1.0, 1.0, 10, 10, 0, 0, {}});
  const int64_t top = simulate(chain, solve_no_checkpoint(chain)).peak_bytes;
  const auto roomy = solve_optimal(chain, top, OptimalOptions{static_cast<int>(top), false});
  ASSERT_TRUE(roomy.has_value());
  EXPECT_EQ(to_string(*roomy), "Fall0 Fall1 Fall2 L B2 B1 B0");
  const auto tight = solve_optimal(chain, 80, OptimalOptions{80, false});
  ASSERT_TRUE(tight.has_value());
  const SimulationResult result = simulate(chain, *tight);
  EXPECT_LE(result.peak_bytes, 80);
  EXPECT_EQ(result.time, 7.0);
  EXPECT_EQ(to_string(*tight), "Fall0 Fall1.1 Fall2 L B2 B1.1 B0");
}

TEST(OptimalSolverTest, RejectsBadArguments) {
  const Chain chain = homogeneous_chain(4, 1.0, 2.0, 4096, 8192);
  try {
    solve_optimal(chain, 1024);
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("ckpt::plan::solve_optimal: budget_bytes must be at least the chain's "
                           "input_bytes (4096)"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("but got 1024"), std::string::npos) << message;
  }
  EXPECT_THROW(solve_optimal(chain, 1 << 20, OptimalOptions{0, false}), std::invalid_argument);
  EXPECT_THROW(solve_optimal(Chain{}, 1 << 20), std::invalid_argument);
  const OptimalTable table(chain, 1 << 20);
  try {
    table.solve((1 << 20) + 1);
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what())
                  .find("ckpt::plan::OptimalTable::solve: budget_bytes must "
                        "be at most the table's max_budget_bytes"),
              std::string::npos)
        << error.what();
  }
  EXPECT_THROW(table.solve(100), std::invalid_argument);
  EXPECT_THROW(OptimalTable(chain, 100), std::invalid_argument);
}

TEST(OptimalSolverTest, InfeasibleBudgetGivesNoSchedule) {
  const Chain chain = homogeneous_chain(6, 1.0, 2.0, 100, 300);
  const int64_t bottom = min_feasible_budget_bytes(chain);
  EXPECT_FALSE(solve_optimal(chain, bottom - 1).has_value());
  EXPECT_TRUE(solve_optimal(chain, bottom).has_value());
  EXPECT_FALSE(solve_optimal(chain, chain.input_bytes).has_value());
}

}  // namespace
}  // namespace plan
}  // namespace ckpt
