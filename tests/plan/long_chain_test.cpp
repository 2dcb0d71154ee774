// Tests of the planner on long chains (issue 27, item 13): the sparse min-max and truncated
// programs (docs/memory-model.md, "Long chains") against the exact ones where both run, 5000
// stages planned in bounded memory, and size limits whose advice works.

#include <gtest/gtest.h>

#include "plan_support.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>

#include "ckpt/plan/simulator.h"
#include "ckpt/plan/solvers.h"

namespace ckpt {
namespace plan {
namespace {

using test::random_chain;

// Options under which a chain of `stages` stages gets the sparse programs (their dense pairs,
// about L^3 / 6, are above the limits).
OptimalOptions sparse_options(int stages) {
  OptimalOptions options;
  options.max_min_memory_pairs = int64_t{stages} * stages * stages / 30;
  options.max_truncated_pairs = options.max_min_memory_pairs;
  return options;
}

// The sparse minimum is a schedule's exact peak, never below the exact minimum nor above storing
// everything, and close to the exact one: measured (docs/memory-model.md) at most one largest
// activation above it, which homogeneous chains reach.
TEST(LongChainTest, SparseMinimumIsReachedAndBoundsTheExactOne) {
  std::mt19937 rng(27);
  for (int trial = 0; trial < 24; ++trial) {
    const int stages = 60 + 10 * (trial % 5);
    const Chain chain = trial % 6 == 5 ? homogeneous_chain(stages, 1.0, 2.0, 1 << 20, 3 << 20)
                                       : random_chain(rng, stages, 1 << 20, trial % 3 == 2);
    const OptimalOptions sparse = sparse_options(stages);
    const int64_t exact = min_feasible_budget_bytes(chain);
    const int64_t approximate = min_feasible_budget_bytes(chain, sparse);
    const SimulationResult reached = simulate(chain, solve_min_memory(chain, sparse));
    ASSERT_TRUE(reached.valid) << reached.error;
    EXPECT_EQ(reached.peak_bytes, approximate) << "trial " << trial;
    EXPECT_GE(approximate, exact) << "trial " << trial;
    EXPECT_LE(approximate, simulate(chain, solve_no_checkpoint(chain)).peak_bytes);
    int64_t largest = 0;
    for (int i = 0; i <= chain.size(); ++i) largest = std::max(largest, chain.activation_bytes(i));
    EXPECT_LE(approximate - exact, largest) << "trial " << trial;
  }
}

// The sparse truncated program answers every budget from the sparse minimum (same structure),
// and its schedules fit.
TEST(LongChainTest, SparseTruncatedProgramFitsFromItsMinimum) {
  std::mt19937 rng(13);
  for (int trial = 0; trial < 12; ++trial) {
    const Chain chain = random_chain(rng, 80, 1 << 20, trial % 2);
    const OptimalOptions sparse = sparse_options(chain.size());
    const int64_t smallest = min_feasible_budget_bytes(chain, sparse);
    const int64_t peak = simulate(chain, solve_no_checkpoint(chain)).peak_bytes;
    for (int step = 0; step <= 4; ++step) {
      const int64_t budget = smallest + (peak - smallest) * step / 16;
      const auto schedule = solve_truncated(chain, budget, 8, sparse);
      ASSERT_TRUE(schedule.has_value()) << "trial " << trial << ", budget " << budget;
      const SimulationResult result = simulate(chain, *schedule);
      EXPECT_TRUE(result.valid) << result.error;
      EXPECT_LE(result.peak_bytes, budget);
    }
  }
}

// Once refused: the min-max table alone took (L+1)^2 * 48 bytes, 1.2 GB for 5000 stages, and its
// O(L^3) time made 4000 stages take four minutes.
TEST(LongChainTest, FiveThousandStagesPlanInBoundedMemory) {
  EXPECT_LT(optimal_table_bytes(5000), int64_t{400} << 20);
  EXPECT_LT(optimal_table_bytes(20000), int64_t{1} << 30);
  std::mt19937 rng(5);
  const Chain chain = random_chain(rng, 5000, 1 << 20, 0);
  const int64_t smallest = min_feasible_budget_bytes(chain);
  const SimulationResult all = simulate(chain, solve_no_checkpoint(chain));
  EXPECT_LE(smallest, all.peak_bytes);
  for (const int64_t budget : {smallest, all.peak_bytes / 4}) {
    const auto schedule = solve_optimal(chain, budget);
    ASSERT_TRUE(schedule.has_value()) << budget;
    const SimulationResult result = simulate(chain, *schedule);
    EXPECT_TRUE(result.valid) << result.error;
    EXPECT_LE(result.peak_bytes, budget);
  }
}

// The number in "at most N" of a size error.
int64_t advised(const std::string& message, const std::string& before) {
  const size_t at = message.find(before);
  EXPECT_NE(at, std::string::npos) << message;
  return at == std::string::npos ? 0 : std::stoll(message.substr(at + before.size()));
}

// Once "use fewer slots" for a limit that only fewer stages could meet.
TEST(LongChainTest, SizeErrorsGiveAdviceThatWorks) {
  OptimalOptions options;
  options.max_table_bytes = 5 << 20;
  const Chain chain = homogeneous_chain(3000, 1.0, 2.0, 1 << 20, 3 << 20);
  try {
    min_feasible_budget_bytes(chain, options);
    ADD_FAILURE() << "expected std::length_error";
  } catch (const std::length_error& error) {
    const int64_t stages = advised(error.what(), "Merge consecutive stages into at most ");
    EXPECT_GT(stages, 100);
    EXPECT_LT(stages, 3000);
    const Chain merged = homogeneous_chain(static_cast<int>(stages), 1.0, 2.0, 1 << 20, 3 << 20);
    EXPECT_NO_THROW(min_feasible_budget_bytes(merged, options));
    const Chain more = homogeneous_chain(static_cast<int>(stages) + 1, 1.0, 2.0, 1 << 20, 3 << 20);
    EXPECT_THROW(min_feasible_budget_bytes(more, options), std::length_error);
  }
  const Chain short_chain = homogeneous_chain(100, 1.0, 2.0, 1 << 20, 3 << 20);
  options.slots = 20000;
  try {
    OptimalTable table(short_chain, 1 << 30, options);
    ADD_FAILURE() << "expected std::length_error";
  } catch (const std::length_error& error) {
    options.slots = static_cast<int>(advised(error.what(), "Use at most "));
    EXPECT_GT(options.slots, 100);
    EXPECT_NO_THROW(OptimalTable(short_chain, 1 << 30, options));
    ++options.slots;
    EXPECT_THROW(OptimalTable(short_chain, 1 << 30, options), std::length_error);
  }
}

}  // namespace
}  // namespace plan
}  // namespace ckpt
