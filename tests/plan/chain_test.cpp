// Tests of ckpt/plan/chain.h: validation messages, storage options, helpers.

#include "ckpt/plan/chain.h"
#include "ckpt/plan/simulator.h"
#include "ckpt/plan/solvers.h"

#include <gtest/gtest.h>

#include "plan_support.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace ckpt {
namespace plan {
namespace {

using test::two_stage_chain;

// Expects `fn` to throw std::invalid_argument whose message contains every substring.
template <class F>
void expect_invalid(F fn, std::initializer_list<const char*> substrings) {
  try {
    fn();
    ADD_FAILURE() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& error) {
    const std::string message = error.what();
    for (const char* substring : substrings) {
      EXPECT_NE(message.find(substring), std::string::npos)
          << "missing \"" << substring << "\" in: " << message;
    }
  }
}

TEST(ChainTest, ValidChainPasses) {
  EXPECT_NO_THROW(two_stage_chain().validate());
}

TEST(ChainTest, ScaleTimesScalesEveryTimeAndKeepsThePlans) {
  Chain chain = two_stage_chain();
  chain.stages[0].forward_all_time = 1.5;
  chain.stages[1].alternatives.push_back(StorageOption{0.25, 0.5, 45, 0, 0, {}});
  const Chain scaled = scale_times(chain, 4.0);
  EXPECT_EQ(scaled.stages[0].forward_time, 4.0 * chain.stages[0].forward_time);
  EXPECT_EQ(scaled.stages[0].forward_all_time, 6.0);
  EXPECT_EQ(scaled.stages[1].forward_all_time, -1.0);  // still "the same as forward_time"
  EXPECT_EQ(scaled.stages[1].backward_time, 4.0 * chain.stages[1].backward_time);
  EXPECT_EQ(scaled.stages[1].alternatives[0].forward_time, 1.0);
  EXPECT_EQ(scaled.stages[1].alternatives[0].backward_time, 2.0);
  EXPECT_EQ(scaled.stages[1].alternatives[0].saved_bytes, 45);
  const int64_t low = min_feasible_budget_bytes(chain);
  const int64_t high = simulate(chain, solve_no_checkpoint(chain)).peak_bytes;
  for (int64_t budget = low; budget <= high; ++budget) {
    const auto plan = solve_optimal(chain, budget);
    const auto scaled_plan = solve_optimal(scaled, budget);
    ASSERT_TRUE(plan && scaled_plan);
    EXPECT_EQ(to_string(*plan), to_string(*scaled_plan)) << "budget " << budget;
    EXPECT_DOUBLE_EQ(simulate(scaled, *scaled_plan).time, 4.0 * simulate(chain, *plan).time);
  }
  expect_invalid([&] { scale_times(chain, 0.0); }, {"scale_times", "positive", "0.0"});
  expect_invalid([&] { scale_times(chain, std::nan("")); }, {"positive and finite"});
}

TEST(ChainTest, RejectsEmptyChain) {
  Chain chain;
  expect_invalid([&] { chain.validate(); },
                 {"ckpt::plan::Chain::validate", "at least one stage", "but got 0"});
}

TEST(ChainTest, RejectsNegativeSizes) {
  Chain chain = two_stage_chain();
  chain.input_bytes = -1;
  expect_invalid([&] { chain.validate(); }, {"input_bytes", "but got -1"});
  chain = two_stage_chain();
  chain.stages[1].forward_tmp_bytes = -3;
  expect_invalid([&] { chain.validate(); }, {"stages[1].forward_tmp_bytes", "but got -3"});
  chain = two_stage_chain();
  chain.stages[0].forward_all_tmp_bytes = -2;
  expect_invalid([&] { chain.validate(); },
                 {"stages[0].forward_all_tmp_bytes", "-1", "but got -2"});
  chain = two_stage_chain();
  chain.stages[0].backward_tmp_bytes = -4;
  expect_invalid([&] { chain.validate(); }, {"stages[0].backward_tmp_bytes"});
  chain = two_stage_chain();
  chain.stages[0].output_bytes = -5;
  expect_invalid([&] { chain.validate(); }, {"stages[0].output_bytes"});
}

TEST(ChainTest, RejectsNegativeOrNonFiniteTimes) {
  Chain chain = two_stage_chain();
  chain.stages[0].forward_time = -1.0;
  expect_invalid([&] { chain.validate(); }, {"stages[0].forward_time", "finite time >= 0"});
  chain = two_stage_chain();
  chain.stages[1].backward_time = std::nan("");
  expect_invalid([&] { chain.validate(); }, {"stages[1].backward_time"});
  chain = two_stage_chain();
  chain.stages[1].backward_time = INFINITY;
  expect_invalid([&] { chain.validate(); }, {"stages[1].backward_time"});
  chain = two_stage_chain();
  chain.stages[0].forward_all_time = -2.0;
  expect_invalid([&] { chain.validate(); }, {"stages[0].forward_all_time", "or -1"});
  chain = two_stage_chain();
  chain.stages[0].forward_all_time = std::nan("");
  expect_invalid([&] { chain.validate(); }, {"stages[0].forward_all_time"});
  // With forward_all_time set, the no-grad forward_time is still checked.
  chain = two_stage_chain();
  chain.stages[0].forward_all_time = 1.5;
  chain.stages[0].forward_time = INFINITY;
  expect_invalid([&] { chain.validate(); }, {"stages[0].forward_time"});
}

TEST(ChainTest, RejectsSavedBytesSmallerThanOutput) {
  Chain chain = two_stage_chain();
  chain.stages[1].saved_bytes = 39;
  expect_invalid([&] { chain.validate(); },
                 {"stages[1].saved_bytes", "output_bytes (40)", "but got 39"});
}

TEST(ChainTest, RejectsInvalidAlternative) {
  Chain chain = two_stage_chain();
  chain.stages[0].alternatives.push_back(StorageOption{1.0, 1.0, 19, 0, 0, {}});
  expect_invalid([&] { chain.validate(); },
                 {"stages[0].alternatives[0].saved_bytes", "but got 19"});
  chain.stages[0].alternatives[0] = StorageOption{-1.0, 1.0, 25, 0, 0, {}};
  expect_invalid([&] { chain.validate(); }, {"stages[0].alternatives[0].forward_time"});
}

// Four stages of 2^62 bytes once made the planner print a minimum budget of -2^63.
TEST(ChainTest, RejectsSizesWhoseSumOverflows) {
  Chain chain = homogeneous_chain(4, 1.0, 1.0, 8, 8);
  chain.input_bytes = int64_t{1} << 62;
  for (Stage& stage : chain.stages) stage.output_bytes = stage.saved_bytes = int64_t{1} << 62;
  expect_invalid([&] { chain.validate(); }, {"2^60 bytes", "bits or elements"});
  expect_invalid([&] { min_feasible_budget_bytes(chain); }, {"2^60 bytes"});
  expect_invalid([&] { simulate(chain, solve_no_checkpoint(chain)); }, {"2^60 bytes"});
}

TEST(ChainTest, RejectsTimesWhoseSumIsInfinite) {
  Chain chain = homogeneous_chain(4, 1.0, 1.0, 8, 8);
  for (Stage& stage : chain.stages) stage.forward_time = stage.backward_time = 1e308;
  expect_invalid([&] { chain.validate(); }, {"times of the chain", "1e200"});
}

// At the limit every sum the planner forms is exact: the minimum budget is positive, and the
// planner's schedules fit the budgets they are solved for.
TEST(ChainTest, ChainAtTheSizeLimitPlansExactly) {
  // The input and 5 sizes a stage (output, saved, backward temporaries, and the forward
  // temporaries of both the no-grad forward and option 0, which share a field).
  const int64_t size = Chain::kMaxTotalBytes / 21;
  Chain chain = homogeneous_chain(4, 1.0, 2.0, size, size);
  for (Stage& stage : chain.stages) stage.forward_tmp_bytes = stage.backward_tmp_bytes = size;
  ASSERT_NO_THROW(chain.validate());
  const int64_t min_budget = min_feasible_budget_bytes(chain);
  EXPECT_GT(min_budget, 0);
  const SimulationResult smallest = simulate(chain, solve_min_memory(chain));
  EXPECT_TRUE(smallest.valid);
  EXPECT_EQ(smallest.peak_bytes, min_budget);
  const SimulationResult all = simulate(chain, solve_no_checkpoint(chain));
  EXPECT_GT(all.peak_bytes, min_budget);
  for (const int64_t budget : {min_budget, (min_budget + all.peak_bytes) / 2, all.peak_bytes}) {
    const auto schedule = solve_optimal(chain, budget);
    ASSERT_TRUE(schedule.has_value()) << budget;
    const SimulationResult result = simulate(chain, *schedule);
    EXPECT_TRUE(result.valid);
    EXPECT_LE(result.peak_bytes, budget);
    EXPECT_TRUE(std::isfinite(result.time));
  }
}

TEST(ChainTest, OptionZeroIsTheStageItself) {
  Chain chain = two_stage_chain();
  chain.stages[0].alternatives.push_back(StorageOption{4.0, 5.0, 21, 2, 3, {}});
  const Stage& stage = chain.stages[0];
  EXPECT_EQ(stage.option_count(), 2);
  const StorageOption own = stage.option(0);
  EXPECT_EQ(own.forward_time, 1.0);
  EXPECT_EQ(own.backward_time, 2.0);
  EXPECT_EQ(own.saved_bytes, 30);
  EXPECT_EQ(own.forward_tmp_bytes, 5);
  EXPECT_EQ(own.backward_tmp_bytes, 7);
  EXPECT_EQ(stage.option(1).saved_bytes, 21);
  expect_invalid([&] { stage.option(2); }, {"ckpt::plan::Stage::option", "[0, 2)", "but got 2"});
  // The grad-enabled forward's own time, where it is set: Fall takes it, the no-grad forwards
  // keep forward_time.
  chain.stages[0].forward_all_time = 1.25;
  EXPECT_EQ(chain.stages[0].option(0).forward_time, 1.25);
  EXPECT_EQ(chain.stages[0].forward_time, 1.0);
  chain.validate();
}

TEST(ChainTest, ActivationBytesIndexesInputThenOutputs) {
  const Chain chain = two_stage_chain();
  EXPECT_EQ(chain.size(), 2);
  EXPECT_EQ(chain.activation_bytes(0), 10);
  EXPECT_EQ(chain.activation_bytes(1), 20);
  EXPECT_EQ(chain.activation_bytes(2), 40);
  expect_invalid([&] { chain.activation_bytes(3); }, {"ckpt::plan::Chain::activation_bytes"});
}

TEST(ChainTest, HomogeneousChainHasEqualStages) {
  const Chain chain = homogeneous_chain(5, 1.0, 2.0, 100, 300);
  EXPECT_EQ(chain.size(), 5);
  EXPECT_EQ(chain.input_bytes, 100);
  for (const Stage& stage : chain.stages) {
    EXPECT_EQ(stage.output_bytes, 100);
    EXPECT_EQ(stage.saved_bytes, 300);
    EXPECT_EQ(stage.forward_time, 1.0);
    EXPECT_EQ(stage.backward_time, 2.0);
  }
  expect_invalid([] { homogeneous_chain(0, 1.0, 1.0, 1, 1); },
                 {"ckpt::plan::homogeneous_chain", "but got 0"});
  expect_invalid([] { homogeneous_chain(3, 1.0, 1.0, 10, 5); }, {"saved_bytes"});
}

}  // namespace
}  // namespace plan
}  // namespace ckpt
