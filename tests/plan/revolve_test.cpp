// Tests of Revolve (binomial checkpointing) in ckpt/plan/solvers.h: closed form vs dynamic
// program, schedules in rotor's op language, and the optimal DP restricted to the AD model.

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "ckpt/plan/simulator.h"
#include "ckpt/plan/solvers.h"

namespace ckpt {
namespace plan {
namespace {

TEST(RevolveTest, ClosedFormMatchesDynamicProgram) {
  for (int steps = 1; steps < 60; ++steps) {
    for (int slots = 1; slots <= 6; ++slots) {
      EXPECT_EQ(revolve_forward_count(steps, slots), revolve_forward_count_dp(steps, slots))
          << "steps=" << steps << " slots=" << slots;
    }
  }
}

TEST(RevolveTest, ClosedFormKnownValues) {
  // algorithms.md §1.3: (l, s) -> extra forwards.
  EXPECT_EQ(revolve_forward_count(32, 4), 75);
  EXPECT_EQ(revolve_forward_count(32, 8), 54);
  EXPECT_EQ(revolve_forward_count(64, 8), 137);
  EXPECT_EQ(revolve_forward_count(128, 11), 293);
  EXPECT_EQ(revolve_forward_count(1000, 8), 4285);
  EXPECT_EQ(revolve_forward_count(1000, 32), 2405);
  EXPECT_EQ(revolve_forward_count(10, 1), 45);  // l(l-1)/2
  EXPECT_EQ(revolve_forward_count(10, 50), 9);  // enough slots: l - 1
  EXPECT_EQ(revolve_forward_count(1, 1), 0);
}

TEST(RevolveTest, RejectsNonPositiveArguments) {
  EXPECT_THROW(revolve_forward_count(0, 3), std::invalid_argument);
  EXPECT_THROW(revolve_forward_count(3, 0), std::invalid_argument);
  EXPECT_THROW(revolve_forward_count_dp(3, 0), std::invalid_argument);
  try {
    solve_revolve(homogeneous_chain(4, 1.0, 1.0, 1, 1), 0);
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("ckpt::plan::solve_revolve: slots must be at least 1"),
              std::string::npos)
        << error.what();
  }
}

TEST(RevolveTest, ScheduleIsValidAndHasTheClosedFormForwardCount) {
  for (int stages = 1; stages <= 40; ++stages) {
    const Chain chain = homogeneous_chain(stages, 1.0, 2.0, 16, 48);
    for (int slots = 1; slots <= 7; ++slots) {
      const Schedule schedule = solve_revolve(chain, slots);
      const SimulationResult result = simulate(chain, schedule);
      ASSERT_TRUE(result.valid) << result.error << "\n" << to_string(schedule);
      EXPECT_EQ(result.forward_count, revolve_forward_count(stages, slots) + stages)
          << "stages=" << stages << " slots=" << slots;
    }
  }
}

TEST(RevolveTest, SmallScheduleByHand) {
  // 3 steps, 1 slot: advance to x2 and reverse step 2 (with the loss), then advance to x1...
  const Chain chain = homogeneous_chain(3, 1.0, 1.0, 1, 1);
  EXPECT_EQ(to_string(solve_revolve(chain, 1)), "Fck0 Fn1 Fall2 L B2 Fck0 Fall1 B1 Fall0 B0");
  EXPECT_EQ(to_string(solve_revolve(chain, 3)), "Fck0 Fck1 Fall2 L B2 Fall1 B1 Fall0 B0");
}

// The optimal DP restricted to the AD model (forward_all only right before its own backward) on
// a homogeneous chain of unit sizes: with a budget of s + 4 units (x_0 and s - 1 more
// checkpoints, the working state, and the three buffers of a backward: δ_{i+1}, x̄_{i+1}, δ_i),
// it does exactly Revolve's number of advances with s slots, plus one taped forward per stage.
TEST(RevolveTest, RestrictedOptimalDpMatchesClosedForm) {
  OptimalOptions options;
  options.forward_all_only_before_backward = true;
  for (int stages = 1; stages <= 30; ++stages) {
    const Chain chain = homogeneous_chain(stages, 1.0, 0.0, 1, 1);
    for (int slots = 1; slots <= 6; ++slots) {
      const int64_t budget = slots + 4;
      options.slots = static_cast<int>(budget);  // one slot per byte: no rounding
      const auto schedule = solve_optimal(chain, budget, options);
      ASSERT_TRUE(schedule.has_value()) << "stages=" << stages << " slots=" << slots;
      const SimulationResult result = simulate(chain, *schedule);
      ASSERT_TRUE(result.valid) << result.error;
      EXPECT_LE(result.peak_bytes, budget);
      EXPECT_EQ(result.forward_count, revolve_forward_count(stages, slots) + stages)
          << "stages=" << stages << " slots=" << slots << "\n"
          << to_string(*schedule);
      // Revolve's own schedule fits the same budget.
      const SimulationResult revolve = simulate(chain, solve_revolve(chain, slots));
      EXPECT_LE(revolve.peak_bytes, budget) << "stages=" << stages << " slots=" << slots;
    }
  }
}

}  // namespace
}  // namespace plan
}  // namespace ckpt
