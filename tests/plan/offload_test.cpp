// Offloading in the planner (docs/memory-model.md, "Offloading"): the simulator's host memory
// and copy-time rules by hand, and every solver that chooses options against the brute force over
// persistent schedules with host budgets that bind and that do not.

#include <gtest/gtest.h>

#include "brute_force.h"
#include "plan_support.h"
#include "reference_accounting.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "ckpt/plan/simulator.h"
#include "ckpt/plan/solvers.h"
#include "ckpt/plan/spec.h"

namespace ckpt {
namespace plan {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();
constexpr int64_t kUnlimited = std::numeric_limits<int64_t>::max();
constexpr OpKind kFck = OpKind::ForwardInput;
constexpr OpKind kFall = OpKind::ForwardAll;
constexpr OpKind kB = OpKind::Backward;
constexpr OpKind kLoss = OpKind::Loss;

// docs/memory-model.md's two-stage example, each stage with an offload option 1 that keeps only
// its output on the device: stage 0 offloads 10 bytes, stage 1 30 bytes; both bring them back at
// the start of their backward (backward_tmp_bytes grows by as much).
Chain offload_chain(double host_bandwidth) {
  Chain chain = test::two_stage_chain();
  chain.host_bandwidth = host_bandwidth;
  chain.stages[0].alternatives.push_back(StorageOption{1.0, 2.0, 20, 5, 17, "offloaded", 10});
  chain.stages[1].alternatives.push_back(StorageOption{2.0, 3.0, 40, 0, 31, "offloaded", 30});
  return chain;
}

test::ReferenceScore score(const Chain& chain, const Schedule& schedule) {
  return test::ReferenceAccounting(chain).score(schedule);
}

TEST(OffloadSimulatorTest, ForwardAllAddsHostMemoryAndItsBackwardReleasesIt) {
  const Chain chain = offload_chain(0.0);
  // Both offloaded at once: 10 + 30 bytes in host memory.
  const SimulationResult nested = simulate(
      chain, Schedule{{{kFall, 0, 1}, {kFall, 1, 1}, {kLoss, 2, 0}, {kB, 1, 1}, {kB, 0, 1}}});
  ASSERT_TRUE(nested.valid) << nested.error;
  EXPECT_EQ(nested.host_peak_bytes, 40);
  // The device keeps only the outputs: Fall0.1 35, Fall1.1 70, L 110, B1.1 110 + 20 + 31.
  EXPECT_EQ(nested.peak_bytes, 161);
  // B1.1 releases its 30 bytes before Fall0.1 adds 10.
  const SimulationResult one_after_the_other = simulate(
      chain,
      Schedule{
          {{kFck, 0, 0}, {kFall, 1, 1}, {kLoss, 2, 0}, {kB, 1, 1}, {kFall, 0, 1}, {kB, 0, 1}}});
  ASSERT_TRUE(one_after_the_other.valid) << one_after_the_other.error;
  EXPECT_EQ(one_after_the_other.host_peak_bytes, 30);
  // Without offloading, no host memory.
  EXPECT_EQ(simulate(chain, solve_no_checkpoint(chain)).host_peak_bytes, 0);
}

TEST(OffloadSimulatorTest, CopiesOverlapTheComputeAndTakeTheLongerOfTheTwo) {
  const Schedule both{{{kFall, 0, 1}, {kFall, 1, 1}, {kLoss, 2, 0}, {kB, 1, 1}, {kB, 0, 1}}};
  // Free copies: the compute times, 1 + 2 + 3 + 2.
  EXPECT_EQ(simulate(offload_chain(0.0), both).time, 8.0);
  // 5 bytes per unit: stage 0 copies 10 bytes in 2 units, stage 1 30 bytes in 6:
  // Fall0.1 max(1, 2) + Fall1.1 max(2, 6) + B1.1 max(3, 6) + B0.1 max(2, 2).
  EXPECT_EQ(simulate(offload_chain(5.0), both).time, 2.0 + 6.0 + 6.0 + 2.0);
  // Fast copies hide entirely behind the compute.
  EXPECT_EQ(simulate(offload_chain(1000.0), both).time, 8.0);
  // Option 0 never copies.
  const Chain chain = offload_chain(5.0);
  EXPECT_EQ(simulate(chain, solve_no_checkpoint(chain)).time, 8.0);
}

TEST(OffloadChainTest, ValidatesOffloadedBytesAndTheBandwidth) {
  Chain chain = offload_chain(5.0);
  EXPECT_NO_THROW(chain.validate());
  EXPECT_EQ(chain.max_host_bytes(), 40);
  chain.stages[1].alternatives[0].offloaded_bytes = -1;
  EXPECT_THROW(
      {
        try {
          chain.validate();
        } catch (const std::invalid_argument& error) {
          EXPECT_NE(std::string(error.what()).find("stages[1].alternatives[0].offloaded_bytes"),
                    std::string::npos)
              << error.what();
          throw;
        }
      },
      std::invalid_argument);
  for (const double bandwidth : {-1.0, kInfinity, std::nan("")}) {
    Chain bad = offload_chain(bandwidth);
    EXPECT_THROW(bad.validate(), std::invalid_argument) << bandwidth;
  }
  // Offloaded bytes count in the totals' limit.
  Chain huge = offload_chain(0.0);
  huge.stages[0].alternatives[0].offloaded_bytes = Chain::kMaxTotalBytes;
  EXPECT_THROW(huge.validate(), std::invalid_argument);
}

TEST(OffloadChainTest, ScaleTimesScalesTheCopiesToo) {
  const Chain chain = offload_chain(5.0);
  const Chain scaled = scale_times(chain, 4.0);
  EXPECT_EQ(scaled.host_bandwidth, 1.25);
  const Schedule both{{{kFall, 0, 1}, {kFall, 1, 1}, {kLoss, 2, 0}, {kB, 1, 1}, {kB, 0, 1}}};
  EXPECT_EQ(simulate(scaled, both).time, 4.0 * simulate(chain, both).time);
}

// Host budgets worth trying on a chain: unlimited, and each host peak of a persistent schedule
// and one byte below it (where the fastest schedule changes), at most `count` of them.
std::vector<int64_t> host_budgets(const std::vector<test::Scored>& all, size_t count) {
  std::set<int64_t> peaks;
  for (const test::Scored& s : all) {
    peaks.insert(s.host_peak_bytes);
    if (s.host_peak_bytes > 0) peaks.insert(s.host_peak_bytes - 1);
  }
  std::vector<int64_t> budgets{kUnlimited};
  const size_t stride = std::max<size_t>(1, peaks.size() / count);
  size_t index = 0;
  for (const int64_t peak : peaks) {
    if (index++ % stride == 0) budgets.push_back(peak);
  }
  return budgets;
}

// Device budgets where the fastest schedule changes, at most `count` of them.
std::vector<int64_t> device_budgets(const Chain& chain, const std::vector<test::Scored>& all,
                                    size_t count) {
  std::set<int64_t> peaks;
  for (const test::Scored& s : all) {
    if (s.peak_bytes - 1 >= chain.input_bytes) peaks.insert(s.peak_bytes - 1);
    peaks.insert(s.peak_bytes);
  }
  std::vector<int64_t> budgets;
  const size_t stride = std::max<size_t>(1, peaks.size() / count);
  size_t index = 0;
  for (const int64_t peak : peaks) {
    if (index++ % stride == 0) budgets.push_back(peak);
  }
  return budgets;
}

// A schedule of the solver under test: fits both budgets by the tests' own accounting, and takes
// `expected`.
void expect_schedule(const Chain& chain, const std::optional<Schedule>& schedule, int64_t budget,
                     int64_t host_budget, double expected) {
  ASSERT_EQ(schedule.has_value(), expected < kInfinity)
      << "budget " << budget << ", host " << host_budget;
  if (!schedule) return;
  const test::ReferenceScore result = score(chain, *schedule);
  ASSERT_TRUE(result.valid) << to_string(*schedule);
  EXPECT_LE(result.peak_bytes, budget) << to_string(*schedule);
  EXPECT_LE(result.host_peak_bytes, host_budget) << to_string(*schedule);
  EXPECT_EQ(result.time, expected) << "budget " << budget << ", host " << host_budget << "\n"
                                   << to_string(*schedule);
}

TEST(OffloadExactTest, EqualsBruteForceWithAndWithoutBindingHostBudgets) {
  std::mt19937 rng(31);
  int pairs = 0, binding = 0;
  for (int trial = 0; trial < 30; ++trial) {
    const Chain chain = test::random_offload_chain(rng, 1 + trial % 5, 12, trial % 4 == 3 ? 1 : 0);
    OptimalOptions options;
    options.forward_all_only_before_backward = trial % 7 == 3;
    const std::vector<test::Scored> all =
        test::score_persistent_schedules(chain, options.forward_all_only_before_backward);
    for (const int64_t host : host_budgets(all, 8)) {
      options.host_budget_bytes = host;
      binding += host < chain.max_host_bytes() ? 1 : 0;
      for (const int64_t budget : device_budgets(chain, all, 40)) {
        const double expected = test::fastest_within(all, budget, host);
        const ExactSolution solution = solve_exact(chain, budget, kUnlimited, options);
        EXPECT_NE(solution.status, ExactSolution::Status::OverWorkLimit);
        expect_schedule(chain, solution.schedule, budget, host, expected);
        ++pairs;
      }
    }
  }
  EXPECT_GE(pairs, 3000);
  EXPECT_GE(binding, 100);
}

TEST(OffloadExactTest, SmallestBudgetsWithinAHostBudgetEqualBruteForce) {
  std::mt19937 rng(310);
  int needs_host = 0;
  for (int trial = 0; trial < 30; ++trial) {
    const Chain chain = test::random_offload_chain(rng, 1 + trial % 5, 12, trial % 4 == 3 ? 1 : 0);
    const std::vector<test::Scored> all = test::score_persistent_schedules(chain, false);
    OptimalOptions options;
    for (const int64_t host : host_budgets(all, 8)) {
      options.host_budget_bytes = host;
      const int64_t smallest = test::smallest_peak_within(all, host);
      EXPECT_EQ(min_feasible_budget_bytes(chain, options), smallest) << "host " << host;
      const test::ReferenceScore result = score(chain, solve_min_memory(chain, options));
      EXPECT_EQ(result.peak_bytes, smallest);
      EXPECT_LE(result.host_peak_bytes, host);
      // Where the host budget binds, the Pareto program gives the fastest at that budget (the
      // min-max program's choices, step by step, need not be).
      if (host < chain.max_host_bytes()) {
        EXPECT_EQ(result.time, test::fastest_within(all, smallest, host));
      }
    }
    for (const int64_t budget : device_budgets(chain, all, 20)) {
      const int64_t host = test::smallest_host_peak_within(all, budget);
      const std::optional<int64_t> found = min_host_budget_bytes(chain, budget);
      ASSERT_EQ(found.has_value(), host >= 0) << "budget " << budget;
      if (found) {
        EXPECT_EQ(*found, host) << "budget " << budget;
      }
      needs_host += host > 0 ? 1 : 0;
    }
  }
  EXPECT_GE(needs_host, 20);  // budgets that no schedule fits without offloading
}

// With one device slot per byte and one host slot per byte of host budget, the table is exact.
TEST(OffloadTableTest, EqualsBruteForceWithOneSlotPerByte) {
  std::mt19937 rng(3100);
  for (int trial = 0; trial < 20; ++trial) {
    const Chain chain = test::random_offload_chain(rng, 1 + trial % 4, 12, 0);
    const std::vector<test::Scored> all = test::score_persistent_schedules(chain, false);
    int64_t max_peak = 0;
    for (const test::Scored& s : all) max_peak = std::max(max_peak, s.peak_bytes);
    for (const int64_t host : host_budgets(all, 4)) {
      if (host == kUnlimited || host == 0) continue;
      OptimalOptions options;
      options.slots = static_cast<int>(max_peak);
      options.host_budget_bytes = host;
      options.host_slots = static_cast<int>(host);
      const OptimalTable table(chain, max_peak, options);
      EXPECT_EQ(table.min_feasible_budget_bytes(), test::smallest_peak_within(all, host));
      for (int64_t budget = chain.input_bytes; budget <= max_peak; ++budget) {
        const double expected = test::fastest_within(all, budget, host);
        EXPECT_EQ(table.time(budget), expected) << "budget " << budget << ", host " << host;
        expect_schedule(chain, table.solve(budget), budget, host, expected);
      }
    }
  }
}

// Coarse host slots round offloaded sizes up: never above the host budget, and never slower than
// the fastest schedule within the host budget less a slot per stage.
TEST(OffloadTableTest, CoarseHostSlotsStayWithinTheHostBudget) {
  std::mt19937 rng(3101);
  int binding = 0;
  for (int trial = 0; trial < 20; ++trial) {
    const Chain chain = test::random_offload_chain(rng, 2 + trial % 4, 12, 0);
    const std::vector<test::Scored> all = test::score_persistent_schedules(chain, false);
    int64_t max_peak = 0;
    for (const test::Scored& s : all) max_peak = std::max(max_peak, s.peak_bytes);
    for (const int64_t host : host_budgets(all, 6)) {
      if (host == kUnlimited || host >= chain.max_host_bytes()) continue;
      ++binding;
      OptimalOptions options;
      options.slots = static_cast<int>(max_peak);
      options.host_budget_bytes = host;
      options.host_slots = 4 * chain.size();
      const OptimalTable table(chain, max_peak, options);
      const int64_t within = host * (options.host_slots - chain.size()) / options.host_slots;
      for (int64_t budget = table.min_feasible_budget_bytes(); budget <= max_peak; ++budget) {
        const std::optional<Schedule> schedule = table.solve(budget);
        ASSERT_TRUE(schedule.has_value()) << "budget " << budget;
        const test::ReferenceScore result = score(chain, *schedule);
        EXPECT_LE(result.peak_bytes, budget);
        EXPECT_LE(result.host_peak_bytes, host);
        EXPECT_GE(result.time, test::fastest_within(all, budget, host));
        EXPECT_LE(result.time, test::fastest_within(all, budget, within)) << "budget " << budget;
      }
    }
  }
  EXPECT_GE(binding, 20);
}

// A host budget of at least every stage's largest offload at once cannot bind: the table has no
// host axis (the same size) and the same answers as with unlimited host memory.
TEST(OffloadTableTest, HostBudgetThatCannotBindChangesNothing) {
  std::mt19937 rng(3102);
  const Chain chain = test::random_offload_chain(rng, 12, 1 << 20, 1);
  OptimalOptions unlimited, roomy = unlimited, tight = unlimited;
  roomy.host_budget_bytes = chain.max_host_bytes();
  tight.host_budget_bytes = chain.max_host_bytes() - 1;
  EXPECT_EQ(optimal_table_bytes(chain, roomy), optimal_table_bytes(chain, unlimited));
  EXPECT_EQ(optimal_table_bytes(chain, tight),
            optimal_table_bytes(chain, unlimited) +
                int64_t{13 * 14 / 2} * (unlimited.slots + 1) * 8 * tight.host_slots);
  // Without a chain, any host budget but the unlimited one counts the host levels.
  EXPECT_EQ(optimal_table_bytes(12, roomy), optimal_table_bytes(chain, tight));
  const int64_t top = simulate(chain, solve_no_checkpoint(chain)).peak_bytes;
  const OptimalTable a(chain, top, unlimited), b(chain, top, roomy);
  for (int64_t budget = a.min_feasible_budget_bytes(); budget <= top; budget += top / 97) {
    EXPECT_EQ(a.time(budget), b.time(budget));
    EXPECT_EQ(a.solve(budget), b.solve(budget));
  }
}

// solve_optimal, by its exact program and by its refined table, never above either budget.
TEST(OffloadOptimalTest, SolveOptimalHonoursTheHostBudget) {
  std::mt19937 rng(3103);
  for (int trial = 0; trial < 8; ++trial) {
    const Chain chain =
        test::random_offload_chain(rng, 2 + trial % 4, 1 << 20, trial % 4 == 1 ? 1 : 0);
    const std::vector<test::Scored> all = test::score_persistent_schedules(chain, false);
    for (const int64_t host : host_budgets(all, 4)) {
      OptimalOptions exact, table;
      exact.host_budget_bytes = table.host_budget_bytes = host;
      table.max_exact_work = 0;  // the refined table
      for (const int64_t budget : device_budgets(chain, all, 8)) {
        const double expected = test::fastest_within(all, budget, host);
        expect_schedule(chain, solve_optimal(chain, budget, exact), budget, host, expected);
        const std::optional<Schedule> refined = solve_optimal(chain, budget, table);
        if (!refined) continue;  // without the Pareto program its smallest budget may be larger
        const test::ReferenceScore result = score(chain, *refined);
        EXPECT_LE(result.peak_bytes, budget);
        EXPECT_LE(result.host_peak_bytes, host);
        EXPECT_GE(result.time, expected);
      }
    }
  }
}

// solve_truncated (long chains) has no host resource: where the host budget binds it offloads
// nothing, so that its schedules always fit.
TEST(OffloadOptimalTest, TruncatedProgramStaysWithinABindingHostBudget) {
  std::mt19937 rng(3104);
  int would_exceed = 0;
  for (int trial = 0; trial < 12; ++trial) {
    const Chain chain = test::random_offload_chain(rng, 3 + trial % 6, 1 << 20, 0);
    OptimalOptions bounded;
    bounded.host_budget_bytes = chain.max_host_bytes() / 2;
    const int64_t low = min_feasible_budget_bytes(chain);
    const int64_t high = simulate(chain, solve_no_checkpoint(chain)).peak_bytes;
    for (int64_t budget = low; budget <= high; budget += std::max<int64_t>(1, (high - low) / 16)) {
      const std::optional<Schedule> free = solve_truncated(chain, budget, 4);
      if (!free || score(chain, *free).host_peak_bytes <= bounded.host_budget_bytes) continue;
      ++would_exceed;
      const std::optional<Schedule> schedule = solve_truncated(chain, budget, 4, bounded);
      if (!schedule) continue;
      const test::ReferenceScore result = score(chain, *schedule);
      EXPECT_LE(result.peak_bytes, budget);
      EXPECT_EQ(result.host_peak_bytes, 0);
    }
  }
  EXPECT_GE(would_exceed, 10);
}

TEST(OffloadSpecTest, TooSmallAHostBudgetSaysSoWithTheSmallestThatWorks) {
  // Stage 0's grad-enabled forward needs 100 bytes of temporaries, its offload option 5: every
  // schedule that does not offload it runs that forward, above the smallest budget.
  Chain chain = offload_chain(0.0);
  chain.stages[0].forward_all_tmp_bytes = 100;
  const int64_t budget = min_feasible_budget_bytes(chain);
  OptimalOptions without;
  without.host_budget_bytes = 0;
  ASSERT_GT(min_feasible_budget_bytes(chain, without), budget);
  const std::optional<int64_t> host = min_host_budget_bytes(chain, budget);
  ASSERT_TRUE(host.has_value());
  EXPECT_EQ(*host, 10);
  OptimalOptions options;
  options.host_budget_bytes = *host;
  const Plan fits = solve(chain, SolverSpec{}, budget, options);
  ASSERT_TRUE(fits.feasible) << fits.message;
  EXPECT_LE(fits.prediction.host_peak_bytes, *host);
  options.host_budget_bytes = *host - 1;
  const Plan refused = solve(chain, SolverSpec{}, budget, options);
  EXPECT_FALSE(refused.feasible);
  EXPECT_NE(refused.message.find("the smallest host budget that works for this budget is " +
                                 std::to_string(*host) + " bytes"),
            std::string::npos)
      << refused.message;
  // Below the device minimum with unlimited host, the message is the device budget's.
  const Plan too_small = solve(chain, SolverSpec{}, 20, options);
  EXPECT_EQ(too_small.message, "no schedule fits the budget");
}

TEST(OffloadOptimalTest, RejectsANegativeHostBudget) {
  OptimalOptions options;
  options.host_budget_bytes = -1;
  const Chain chain = offload_chain(0.0);
  EXPECT_THROW(solve_optimal(chain, 200, options), std::invalid_argument);
  EXPECT_THROW(min_feasible_budget_bytes(chain, options), std::invalid_argument);
  EXPECT_THROW(solve_exact(chain, 200, kUnlimited, options), std::invalid_argument);
}

// Look-ahead (Schedule::look_ahead): stage 0's data comes back during B1.1, which holds it too.
TEST(OffloadLookAheadTest, TheBackwardBeforeHoldsTheDataAndOverlapsItsCopy) {
  Schedule both{{{kFall, 0, 1}, {kFall, 1, 1}, {kLoss, 2, 0}, {kB, 1, 1}, {kB, 0, 1}}};
  const Chain chain = offload_chain(2.0);
  const SimulationResult without = simulate(chain, both);
  both.look_ahead = {0};
  const SimulationResult with = simulate(chain, both);
  ASSERT_TRUE(with.valid) << with.error;
  // B1.1: 110 + 20 + 31 without, and stage 0's 10 bytes with.
  EXPECT_EQ(without.peak_bytes, 161);
  EXPECT_EQ(with.peak_bytes, 171);
  EXPECT_EQ(with.host_peak_bytes, without.host_peak_bytes);
  // 2 bytes per unit: Fall0.1 max(1, 5) + Fall1.1 max(2, 15) + B1.1 max(3, 15) + B0.1 max(2, 5)
  // without; with, B0.1's copy (5) runs beside B1.1 (max(15, 5)) and B0.1 takes its compute, 2.
  EXPECT_EQ(without.time, 5.0 + 15.0 + 15.0 + 5.0);
  EXPECT_EQ(with.time, 5.0 + 15.0 + 15.0 + 2.0);
  EXPECT_EQ(to_string(both), "Fall0.1 Fall1.1 L B1.1 B0.1 ahead: 0");
}

TEST(OffloadLookAheadTest, ALookAheadWithoutItsBackwardNextOrWithoutOffloadingIsInvalid) {
  const Chain chain = offload_chain(0.0);
  Schedule apart{
      {{kFck, 0, 0}, {kFall, 1, 1}, {kLoss, 2, 0}, {kB, 1, 1}, {kFall, 0, 1}, {kB, 0, 1}}, {0}};
  const SimulationResult not_next = simulate(chain, apart);
  EXPECT_FALSE(not_next.valid);
  EXPECT_NE(not_next.error.find("needs its backward right after this one"), std::string::npos)
      << not_next.error;
  Schedule kept{{{kFall, 0, 0}, {kFall, 1, 1}, {kLoss, 2, 0}, {kB, 1, 1}, {kB, 0, 0}}, {0}};
  const SimulationResult plain = simulate(chain, kept);
  EXPECT_FALSE(plain.valid);
  EXPECT_NE(plain.error.find("needs an offload option"), std::string::npos) << plain.error;
}

// add_look_ahead takes a look-ahead only where the peak stays within the budget (or the
// schedule's own peak); plan::solve adds it.
TEST(OffloadLookAheadTest, AddedOnlyWithinTheBudgetAndBySolve) {
  const Schedule both{{{kFall, 0, 1}, {kFall, 1, 1}, {kLoss, 2, 0}, {kB, 1, 1}, {kB, 0, 1}}};
  // B1.1 is the peak (161): holding stage 0's 10 bytes there needs a budget of 171.
  EXPECT_TRUE(add_look_ahead(offload_chain(0.0), both, 170).look_ahead.empty());
  EXPECT_TRUE(add_look_ahead(offload_chain(0.0), both, 0).look_ahead.empty());
  EXPECT_EQ(add_look_ahead(offload_chain(0.0), both, 171).look_ahead, std::vector<int>{0});
  // With B0.1's temporaries the peak, B1.1 has room for it within the schedule's own peak.
  Chain roomy = offload_chain(0.0);
  roomy.stages[0].alternatives[0].backward_tmp_bytes = 200;
  const Schedule ahead = add_look_ahead(roomy, both, 0);
  EXPECT_EQ(ahead.look_ahead, std::vector<int>{0});
  EXPECT_EQ(simulate(roomy, ahead).peak_bytes, simulate(roomy, both).peak_bytes);
  const Plan plan = solve(roomy, SolverSpec{}, simulate(roomy, both).peak_bytes);
  ASSERT_TRUE(plan.feasible) << plan.message;
  for (const int stage : plan.schedule->look_ahead) {
    EXPECT_GT(roomy.stages[static_cast<size_t>(stage)].option(1).offloaded_bytes, 0);
  }
  EXPECT_EQ(plan.prediction.peak_bytes, simulate(roomy, *plan.schedule).peak_bytes);
}

}  // namespace
}  // namespace plan
}  // namespace ckpt
