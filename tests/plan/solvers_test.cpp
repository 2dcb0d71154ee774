// Tests of the baseline solvers of ckpt/plan/solvers.h: no checkpointing, PyTorch's
// checkpoint_sequential segmentation, Chen's √n.

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "ckpt/plan/simulator.h"
#include "ckpt/plan/solvers.h"

namespace ckpt {
namespace plan {
namespace {

Chain numbered_chain(int stages) {
  Chain chain;
  chain.input_bytes = 8;
  for (int i = 0; i < stages; ++i) {
    chain.stages.push_back(
        Stage{1.0 + i, 2.0 + 2 * i, 8 + 4 * (i % 3), 24 + 4 * (i % 3), i % 2, (i + 1) % 3, {}});
  }
  return chain;
}

TEST(NoCheckpointSolverTest, StoresEverythingOnce) {
  const Chain chain = numbered_chain(3);
  EXPECT_EQ(to_string(solve_no_checkpoint(chain)), "Fall0 Fall1 Fall2 L B2 B1 B0");
}

TEST(NoCheckpointSolverTest, TimeIsTheSumOfForwardAndBackward) {
  for (int stages = 1; stages <= 12; ++stages) {
    const Chain chain = numbered_chain(stages);
    double total = 0.0;
    for (const Stage& stage : chain.stages) total += stage.forward_time + stage.backward_time;
    const SimulationResult result = simulate(chain, solve_no_checkpoint(chain));
    ASSERT_TRUE(result.valid) << result.error;
    EXPECT_EQ(result.time, total);
    EXPECT_EQ(result.forward_count, stages);
  }
}

TEST(UniformSolverTest, MatchesCheckpointSequentialSegmentation) {
  // checkpoint_sequential(7 functions, segments=3): segment size 2; [0,1] and [2,3] are
  // checkpointed, [4,6] runs normally.
  const Chain chain = numbered_chain(7);
  EXPECT_EQ(to_string(solve_uniform(chain, 3)),
            "Fck0 Fn1 Fck2 Fn3 Fall4 Fall5 Fall6 L B6 B5 B4 Fall2 Fall3 B3 B2 Fall0 Fall1 B1 B0");
  EXPECT_EQ(solve_uniform(chain, 1), solve_no_checkpoint(chain));
  // segments = n: every stage but the last is its own checkpointed segment.
  EXPECT_EQ(to_string(solve_uniform(numbered_chain(3), 3)),
            "Fck0 Fck1 Fall2 L B2 Fall1 B1 Fall0 B0");
}

TEST(UniformSolverTest, ForwardCountIsStagesPlusCheckpointedStages) {
  for (int stages = 1; stages <= 20; ++stages) {
    const Chain chain = numbered_chain(stages);
    for (int segments = 1; segments <= stages; ++segments) {
      const Schedule schedule = solve_uniform(chain, segments);
      const SimulationResult result = simulate(chain, schedule);
      ASSERT_TRUE(result.valid) << result.error << "\n" << to_string(schedule);
      const int size = stages / segments;
      EXPECT_EQ(result.forward_count, stages + (segments - 1) * size)
          << "stages=" << stages << " segments=" << segments;
      double expected_time = 0.0;
      for (const Stage& stage : chain.stages) {
        expected_time += stage.forward_time + stage.backward_time;
      }
      for (int i = 0; i < (segments - 1) * size; ++i) {
        expected_time += chain.stages[static_cast<size_t>(i)].forward_time;
      }
      EXPECT_DOUBLE_EQ(result.time, expected_time);
    }
  }
}

TEST(UniformSolverTest, RejectsSegmentsOutOfRange) {
  const Chain chain = numbered_chain(4);
  for (int segments : {0, -1, 5}) {
    try {
      solve_uniform(chain, segments);
      FAIL() << "expected std::invalid_argument for segments=" << segments;
    } catch (const std::invalid_argument& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find("ckpt::plan::solve_uniform"), std::string::npos) << message;
      EXPECT_NE(message.find("between 1 and the number of stages (4)"), std::string::npos);
      EXPECT_NE(message.find("but got " + std::to_string(segments)), std::string::npos);
    }
  }
}

TEST(UniformSolverTest, RejectsInvalidChain) {
  EXPECT_THROW(solve_uniform(Chain{}, 1), std::invalid_argument);
  EXPECT_THROW(solve_no_checkpoint(Chain{}), std::invalid_argument);
  EXPECT_THROW(solve_sqrt_n(Chain{}), std::invalid_argument);
}

TEST(SqrtNSolverTest, UsesRoundedSquareRootSegments) {
  EXPECT_EQ(solve_sqrt_n(numbered_chain(1)), solve_uniform(numbered_chain(1), 1));
  EXPECT_EQ(solve_sqrt_n(numbered_chain(2)), solve_uniform(numbered_chain(2), 1));
  EXPECT_EQ(solve_sqrt_n(numbered_chain(3)), solve_uniform(numbered_chain(3), 2));
  EXPECT_EQ(solve_sqrt_n(numbered_chain(16)), solve_uniform(numbered_chain(16), 4));
  EXPECT_EQ(solve_sqrt_n(numbered_chain(20)), solve_uniform(numbered_chain(20), 4));
  EXPECT_EQ(solve_sqrt_n(numbered_chain(21)), solve_uniform(numbered_chain(21), 5));
}

TEST(SqrtNSolverTest, LowersThePeakOnLongHomogeneousChains) {
  const Chain chain = homogeneous_chain(64, 1.0, 2.0, 100, 300);
  const SimulationResult none = simulate(chain, solve_no_checkpoint(chain));
  const SimulationResult sqrt_n = simulate(chain, solve_sqrt_n(chain));
  ASSERT_TRUE(sqrt_n.valid) << sqrt_n.error;
  EXPECT_LT(sqrt_n.peak_bytes * 3, none.peak_bytes);
  EXPECT_EQ(sqrt_n.forward_count, 64 + 7 * 8);
}

}  // namespace
}  // namespace plan
}  // namespace ckpt
