// Tests of ckpt/plan/simulator.h: hand-computed time and peak, every rejection reason, and
// acceptance of every solver's schedules.

#include "ckpt/plan/simulator.h"

#include <gtest/gtest.h>

#include "plan_support.h"

#include <random>
#include <string>

#include "ckpt/plan/solvers.h"

namespace ckpt {
namespace plan {
namespace {

using test::random_chain;
using test::two_stage_chain;

Schedule ops(std::initializer_list<Op> list) {
  return Schedule{std::vector<Op>(list)};
}

constexpr OpKind kFn = OpKind::ForwardNone;
constexpr OpKind kFck = OpKind::ForwardInput;
constexpr OpKind kFall = OpKind::ForwardAll;
constexpr OpKind kB = OpKind::Backward;
constexpr OpKind kLoss = OpKind::Loss;

void expect_rejected(const Chain& chain, const Schedule& schedule, int op_index,
                     const std::string& reason) {
  const SimulationResult result = simulate(chain, schedule);
  EXPECT_FALSE(result.valid) << to_string(schedule);
  EXPECT_EQ(result.error_op_index, op_index) << result.error;
  EXPECT_NE(result.error.find(reason), std::string::npos)
      << "missing \"" << reason << "\" in: " << result.error;
}

TEST(SimulatorTest, NoCheckpointTimeAndPeakByHand) {
  const Chain chain = two_stage_chain();
  const SimulationResult result = simulate(chain, solve_no_checkpoint(chain));
  ASSERT_TRUE(result.valid) << result.error;
  EXPECT_EQ(result.time, 1.0 + 2.0 + 2.0 + 3.0);
  // Fall0: 10+30+5=45 -> 40; Fall1: 40+50=90 -> 90; L: 90+40=130 -> 130;
  // B1: 130+20+1=151 -> 60; B0: 60+10+7=77 -> 20 (x0 + δ0).
  EXPECT_EQ(result.peak_bytes, 151);
  EXPECT_EQ(result.peak_op_index, 3);
  EXPECT_EQ(result.forward_count, 2);
  EXPECT_EQ(result.final_bytes, 20);
}

// Checkpoint x0, recompute both stages after the loss.
Schedule checkpointed_schedule() {
  return ops({{kFck, 0, 0},
              {kFn, 1, 0},
              {kLoss, 2, 0},
              {kFall, 0, 0},
              {kFall, 1, 0},
              {kB, 1, 0},
              {kB, 0, 0}});
}
TEST(SimulatorTest, ParameterGradientsStayFromTheirBackwardToTheEnd) {
  Chain chain = two_stage_chain();
  chain.stages[1].gradient_bytes = 100;
  chain.stages[0].gradient_bytes = 1000;
  const SimulationResult result = simulate(chain, solve_no_checkpoint(chain));
  ASSERT_TRUE(result.valid) << result.error;
  // As NoCheckpointTimeAndPeakByHand until B1 (peak 151); then B1 leaves 60 + 100;
  // B0: 160+10+7=177 -> 20 + 1100.
  EXPECT_EQ(result.peak_bytes, 177);
  EXPECT_EQ(result.peak_op_index, 4);
  EXPECT_EQ(result.final_bytes, 1120);
}

// docs/memory-model.md, "Random state": S = 1000 bytes per copy; stage 1 draws random numbers.
TEST(SimulatorTest, RandomStateCountsWhatTheExecutorHolds) {
  Chain chain = two_stage_chain();
  chain.random_state_bytes = 1000;
  chain.stages[1].random_state_bytes = 1000;
  // Each stage runs once: no stash, and no recompute to keep the caller's state for.
  const SimulationResult plain = simulate(chain, solve_no_checkpoint(chain));
  ASSERT_TRUE(plain.valid) << plain.error;
  EXPECT_EQ(plain.peak_bytes, simulate(two_stage_chain(), solve_no_checkpoint(chain)).peak_bytes);
  EXPECT_EQ(plain.final_bytes, 20);
  // Fck0 (first forward; stage 0 draws nothing: its stash is dropped once a second read of the
  // state, after the forward, shows it): 10+20+S+S = 2030 -> 30; Fn1 (first forward; stage 1
  // keeps its stash): 30+S+40+S = 2070 -> 1050; L: 1090 -> 2050;
  // Fall0 (stage 0 draws nothing): 2085 -> 2080; Fall1 (the caller's state put aside):
  // 2080+50+S = 3130 -> 2130; B1: 2151 -> 2060; B0: 2077 -> 2020, 20 once the executor ends.
  const SimulationResult result = simulate(chain, checkpointed_schedule());
  ASSERT_TRUE(result.valid) << result.error;
  EXPECT_EQ(result.peak_bytes, 3130);
  EXPECT_EQ(result.peak_op_index, 4);
  EXPECT_EQ(result.final_bytes, 20);
  EXPECT_EQ(chain.executor_state_reserve(), 3000);
}

// No stage draws random numbers: only the stash read during a first forward, then dropped once
// a second read after the forward shows the state unmoved. That read comes when the forward's own
// transients are gone: it adds S only where it is the larger.
TEST(SimulatorTest, RandomStateOfStagesThatDrawNoneIsReadAndDropped) {
  Chain chain = two_stage_chain();
  chain.random_state_bytes = 1000;
  // Fck0: 10+20+S+max(5, S) = 2030 -> 30; Fn1: 30+40+S+S = 2070 -> 50; L: 90 -> 50 (nothing
  // replayed: no state kept); Fall0: 85 -> 80; Fall1: 130 -> 130; B1: 151 -> 60; B0: 77 -> 20.
  const SimulationResult result = simulate(chain, checkpointed_schedule());
  ASSERT_TRUE(result.valid) << result.error;
  EXPECT_EQ(result.peak_bytes, 2070);
  EXPECT_EQ(result.peak_op_index, 1);
  EXPECT_EQ(result.final_bytes, 20);
  EXPECT_EQ(chain.executor_state_reserve(), 2000);
  // A forward whose own transients outweigh the second read peaks with them and the stash.
  chain.random_state_bytes = 2;
  EXPECT_EQ(simulate(chain, checkpointed_schedule()).peak_bytes, 151);
  chain.stages[0].forward_tmp_bytes = 500;
  chain.stages[0].forward_all_tmp_bytes = 5;  // Fall0 as before
  // Fck0: 10+20+2+500 = 532.
  EXPECT_EQ(simulate(chain, checkpointed_schedule()).peak_bytes, 532);
}

// A stage's buffers are copied around each of its forwards after the first (the executor's
// BufferGuard, so that BatchNorm's statistics move once) and during the first forward of a stage
// that runs again (to keep those it writes): transients of those forwards alone where it writes
// none.
TEST(SimulatorTest, BufferCopiesAreTransientsOfTheForwardsOfStagesThatRunAgain) {
  Chain chain = two_stage_chain();
  chain.stages[0].buffer_bytes = 100;
  chain.stages[1].buffer_bytes = 1000;
  const SimulationResult plain = simulate(chain, solve_no_checkpoint(chain));
  ASSERT_TRUE(plain.valid) << plain.error;
  EXPECT_EQ(plain.peak_bytes, simulate(two_stage_chain(), solve_no_checkpoint(chain)).peak_bytes);
  // Fck0: 35+b0 = 135 -> 30; Fn1: 70+b1 = 1070 -> 50; L: 90 -> 50; Fall0: 85+b0 = 185 -> 80;
  // Fall1: 130+b1 = 1130 -> 130; B1: 151 -> 60; B0: 77 -> 20.
  const SimulationResult result = simulate(chain, checkpointed_schedule());
  ASSERT_TRUE(result.valid) << result.error;
  EXPECT_EQ(result.peak_bytes, 1130);
  EXPECT_EQ(result.peak_op_index, 4);
  EXPECT_EQ(result.final_bytes, 20);
  EXPECT_EQ(chain.executor_state_reserve(), 1000);
  chain.random_state_bytes = 10;
  EXPECT_EQ(chain.executor_state_reserve(), 1010);
  chain.stages[1].buffer_bytes = -1;
  EXPECT_THROW(chain.validate(), std::invalid_argument);
}

// The copies of the buffers a stage writes, made in its first forward, stay until its backward.
TEST(SimulatorTest, WrittenBufferCopiesStayFromTheFirstForwardToTheBackward) {
  Chain chain = two_stage_chain();
  chain.stages[0].buffer_bytes = chain.stages[0].kept_buffer_bytes = 100;
  chain.stages[1].buffer_bytes = 1000;
  chain.stages[1].kept_buffer_bytes = 400;
  // Fck0: 10+w0+20+5 = 135 -> 130; Fn1: 130+w1+40+(b1-w1) = 1170 -> 550; L: 590 -> 550;
  // Fall0: 550+30+5+b0 = 685 -> 580; Fall1: 580+50+b1 = 1630 -> 630; B1: 651 -> 560-w1 = 160;
  // B0: 177 -> 20.
  const SimulationResult result = simulate(chain, checkpointed_schedule());
  ASSERT_TRUE(result.valid) << result.error;
  EXPECT_EQ(result.peak_bytes, 1630);
  EXPECT_EQ(result.peak_op_index, 4);
  EXPECT_EQ(result.final_bytes, 20);
  EXPECT_EQ(chain.executor_state_reserve(), 1500);
  // Stages that run once copy nothing.
  const SimulationResult plain = simulate(chain, solve_no_checkpoint(chain));
  EXPECT_EQ(plain.peak_bytes, simulate(two_stage_chain(), solve_no_checkpoint(chain)).peak_bytes);
  chain.stages[1].kept_buffer_bytes = 1001;
  EXPECT_THROW(chain.validate(), std::invalid_argument);
}

TEST(SimulatorTest, CheckpointedScheduleByHand) {
  const Chain chain = two_stage_chain();
  // Fck0: 10+20+5=35 -> 30 (x0, x1 kept); Fn1: 30+40=70 -> 50 (x1 freed); L: 50+40=90 -> 50
  // (x2 freed, δ2 kept); Fall0: 50+30+5=85 -> 80; Fall1: 80+50=130 -> 130;
  // B1: 130+20+1=151 -> 60; B0: 60+10+7=77 -> 20.
  const Schedule schedule = checkpointed_schedule();
  const SimulationResult result = simulate(chain, schedule);
  ASSERT_TRUE(result.valid) << result.error;
  EXPECT_EQ(result.time, 1.0 + 2.0 + 1.0 + 2.0 + 3.0 + 2.0);
  EXPECT_EQ(result.peak_bytes, 151);
  EXPECT_EQ(result.forward_count, 4);
  EXPECT_EQ(result.final_bytes, 20);
}

// The same schedule with grad-enabled forwards slower than the no-grad ones: Fck0 and Fn1 take
// forward_time, Fall0 and Fall1 forward_all_time.
TEST(SimulatorTest, ForwardAllTakesTheGradEnabledForwardTime) {
  Chain chain = two_stage_chain();
  chain.stages[0].forward_all_time = 1.5;
  chain.stages[1].forward_all_time = 2.5;
  const Schedule schedule = checkpointed_schedule();
  const SimulationResult result = simulate(chain, schedule);
  ASSERT_TRUE(result.valid) << result.error;
  EXPECT_EQ(result.time, 1.0 + 2.0 + 1.5 + 2.5 + 3.0 + 2.0);
}

TEST(SimulatorTest, ForwardNoneKeepsCheckpointsAndFreesTheRest) {
  Chain chain = homogeneous_chain(3, 1.0, 1.0, 10, 10);
  // Fck0 keeps x0 (always kept) -> x1; Fn1 frees x1 -> x2; Fn2 frees x2 -> x3.
  const Schedule schedule = ops({{kFck, 0, 0},
                                 {kFn, 1, 0},
                                 {kFn, 2, 0},
                                 {kLoss, 3, 0},
                                 {kFck, 0, 0},
                                 {kFall, 1, 0},
                                 {kFall, 2, 0},
                                 {kB, 2, 0},
                                 {kB, 1, 0},
                                 {kFall, 0, 0},
                                 {kB, 0, 0}});
  const SimulationResult result = simulate(chain, schedule);
  ASSERT_TRUE(result.valid) << result.error;
  // Highest: after Fck0 (x0,x1,δ3 = 30) Fall1 holds 40, Fall2 50; B2: 50 + 10 = 60.
  EXPECT_EQ(result.peak_bytes, 60);
  EXPECT_EQ(result.forward_count, 7);
}

TEST(SimulatorTest, ForwardAllUsesItsOwnTemporariesWhenGiven) {
  Chain chain = two_stage_chain();
  chain.stages[0].forward_tmp_bytes = 200;    // the no-grad forward's temporaries
  chain.stages[0].forward_all_tmp_bytes = 1;  // the grad-enabled forward's
  // No checkpointing: Fall0 10+30+1 = 41, and B1's 151 stays the peak.
  const SimulationResult plain = simulate(chain, solve_no_checkpoint(chain));
  ASSERT_TRUE(plain.valid) << plain.error;
  EXPECT_EQ(plain.peak_bytes, 151);
  // Fck0 first: 10+20+200 = 230.
  const SimulationResult checkpointed = simulate(chain, ops({{kFck, 0, 0},
                                                             {kFn, 1, 0},
                                                             {kLoss, 2, 0},
                                                             {kFall, 0, 0},
                                                             {kFall, 1, 0},
                                                             {kB, 1, 0},
                                                             {kB, 0, 0}}));
  ASSERT_TRUE(checkpointed.valid) << checkpointed.error;
  EXPECT_EQ(checkpointed.peak_bytes, 230);
  EXPECT_EQ(chain.stages[0].option(0).forward_tmp_bytes, 1);
}

TEST(SimulatorTest, AlternativeOptionsUseTheirOwnCosts) {
  Chain chain = two_stage_chain();
  chain.stages[1].alternatives.push_back(StorageOption{5.0, 7.0, 40, 3, 2, {}});
  const Schedule schedule =
      ops({{kFall, 0, 0}, {kFall, 1, 1}, {kLoss, 2, 0}, {kB, 1, 1}, {kB, 0, 0}});
  const SimulationResult result = simulate(chain, schedule);
  ASSERT_TRUE(result.valid) << result.error;
  EXPECT_EQ(result.time, 1.0 + 5.0 + 7.0 + 2.0);
  // Fall0: 45 -> 40; Fall1.1: 40+40+3=83 -> 80; L: 120; B1.1: 120+20+2=142 -> 60; B0: 77.
  EXPECT_EQ(result.peak_bytes, 142);
}

TEST(SimulatorTest, RejectsStageOutOfRange) {
  expect_rejected(two_stage_chain(), ops({{kFn, 2, 0}}), 0, "stage must be in [0, 2)");
  expect_rejected(two_stage_chain(), ops({{kB, -1, 0}}), 0, "stage must be in [0, 2)");
}

TEST(SimulatorTest, RejectsBadOptions) {
  expect_rejected(two_stage_chain(), ops({{kFall, 0, 1}}), 0, "option must be in [0, 1)");
  expect_rejected(two_stage_chain(), ops({{kFn, 0, 1}}), 0, "option must be 0");
  Chain chain = two_stage_chain();
  chain.stages[1].alternatives.push_back(StorageOption{1.0, 1.0, 45, 0, 0, {}});
  expect_rejected(chain, ops({{kFall, 0, 0}, {kFall, 1, 1}, {kLoss, 2, 0}, {kB, 1, 0}}), 3,
                  "option must match the forward_all");
}

TEST(SimulatorTest, RejectsForwardWithoutInput) {
  expect_rejected(two_stage_chain(), ops({{kFn, 1, 0}}), 0, "input x_1 is not in memory");
  // Fn1 frees x1 (not a checkpoint): running stage 1 again needs x1.
  expect_rejected(two_stage_chain(), ops({{kFn, 0, 0}, {kFn, 1, 0}, {kLoss, 2, 0}, {kFall, 1, 0}}),
                  3, "input x_1 is not in memory");
}

TEST(SimulatorTest, RejectsForwardWhoseOutputIsInMemory) {
  expect_rejected(two_stage_chain(), ops({{kFall, 0, 0}, {kFn, 0, 0}}), 1,
                  "output x_1 is already in memory");
  expect_rejected(two_stage_chain(), ops({{kFck, 0, 0}, {kFall, 0, 0}}), 1,
                  "output x_1 is already in memory");
}

TEST(SimulatorTest, RejectsForwardOfBackwardedStage) {
  Schedule schedule = solve_no_checkpoint(two_stage_chain());
  schedule.ops.insert(schedule.ops.begin() + 4, Op{kFall, 1, 0});  // after B1
  expect_rejected(two_stage_chain(), schedule, 4, "stage 1 was already backwarded");
}

TEST(SimulatorTest, RejectsLossBeforeOutput) {
  expect_rejected(two_stage_chain(), ops({{kFall, 0, 0}, {kLoss, 2, 0}}), 1,
                  "chain's output x_2 is not in memory");
}

TEST(SimulatorTest, RejectsLossWithWrongStageOrTwice) {
  expect_rejected(two_stage_chain(), ops({{kLoss, 1, 0}}), 0,
                  "loss's stage index must be the number of stages (2)");
  expect_rejected(two_stage_chain(),
                  ops({{kFall, 0, 0}, {kFall, 1, 0}, {kLoss, 2, 0}, {kLoss, 2, 0}}), 3,
                  "loss was already computed");
}

TEST(SimulatorTest, RejectsBackwardWithoutGradient) {
  expect_rejected(two_stage_chain(), ops({{kFall, 0, 0}, {kFall, 1, 0}, {kB, 1, 0}}), 2,
                  "gradient δ_2 is not in memory");
  expect_rejected(two_stage_chain(), ops({{kFall, 0, 0}, {kFall, 1, 0}, {kLoss, 2, 0}, {kB, 0, 0}}),
                  3, "gradient δ_1 is not in memory");
}

TEST(SimulatorTest, RejectsBackwardWithoutSavedActivations) {
  expect_rejected(two_stage_chain(), ops({{kFck, 0, 0}, {kFn, 1, 0}, {kLoss, 2, 0}, {kB, 1, 0}}), 3,
                  "saved activations x̄_2 are not in memory");
}

TEST(SimulatorTest, RejectsBackwardTwice) {
  Schedule schedule = solve_no_checkpoint(two_stage_chain());
  schedule.ops.push_back(Op{kB, 0, 0});
  expect_rejected(two_stage_chain(), schedule, 5, "stage 0 was already backwarded");
}

TEST(SimulatorTest, RejectsIncompleteSchedules) {
  const SimulationResult empty = simulate(two_stage_chain(), Schedule{});
  EXPECT_FALSE(empty.valid);
  EXPECT_EQ(empty.error_op_index, -1);
  EXPECT_NE(empty.error.find("never runs the loss"), std::string::npos) << empty.error;
  expect_rejected(two_stage_chain(), ops({{kFall, 0, 0}, {kFall, 1, 0}, {kLoss, 2, 0}, {kB, 1, 0}}),
                  -1, "ends before stage 0 is backwarded");
}

TEST(SimulatorTest, ThrowsOnInvalidChain) {
  EXPECT_THROW(simulate(Chain{}, Schedule{}), std::invalid_argument);
}

TEST(SimulatorTest, AcceptsEverySolversSchedules) {
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 40; ++trial) {
    const int stages = 1 + trial % 12;
    const Chain chain = random_chain(rng, stages, 1000, trial % 3);
    std::vector<Schedule> schedules = {solve_no_checkpoint(chain), solve_sqrt_n(chain),
                                       solve_min_memory(chain)};
    for (int segments = 1; segments <= stages; ++segments) {
      schedules.push_back(solve_uniform(chain, segments));
    }
    for (int slots = 1; slots <= 4; ++slots) schedules.push_back(solve_revolve(chain, slots));
    const int64_t top = simulate(chain, solve_no_checkpoint(chain)).peak_bytes;
    const int64_t bottom = min_feasible_budget_bytes(chain);
    for (int step = 0; step <= 4; ++step) {
      auto schedule = solve_optimal(chain, bottom + (top - bottom) * step / 4);
      ASSERT_TRUE(schedule.has_value());
      schedules.push_back(*schedule);
    }
    int64_t gradient_bytes = 0;
    for (const Stage& stage : chain.stages) gradient_bytes += stage.gradient_bytes;
    for (const Schedule& schedule : schedules) {
      const SimulationResult result = simulate(chain, schedule);
      EXPECT_TRUE(result.valid) << result.error << "\n" << to_string(schedule);
      // x_0, δ_0 and every parameter gradient.
      EXPECT_EQ(result.final_bytes, chain.input_bytes * 2 + gradient_bytes) << to_string(schedule);
    }
  }
}

}  // namespace
}  // namespace plan
}  // namespace ckpt
