// The planning core both planners share (src/execute/plan_budget.h): budgets and headroom, the
// budget no plan fits, planning for less after running out of memory, and a changed input.

#include "execute/plan_budget.h"

#include "support/support.h"

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>

namespace plan_budget_test {

using ckpt::Budget;
using ckpt::detail::BudgetLimits;

// A plain peak of 1000 bytes, a smallest plan of 300.
constexpr BudgetLimits kLimits{"ckpt::Test", 1000, 300, 0.0};

ckpt::detail::InfeasibleError error_naming_smallest() {
  return [](int64_t bytes, int64_t smallest) {
    return ckpt::InfeasibleBudget(c10::str("no plan fits ", bytes), smallest);
  };
}

TEST(PlanBudgetTest, BytesPercentagesAndTheMinimumResolveAgainstThePlainPeak) {
  const auto resolve = [](const Budget& budget) {
    return ckpt::detail::resolve_budget(budget, kLimits, false, error_naming_smallest());
  };
  EXPECT_EQ(resolve(Budget::bytes(500)).bytes, 500);
  EXPECT_EQ(resolve(Budget::bytes(500)).solved_for, 500);
  EXPECT_FALSE(resolve(Budget::bytes(500)).fits_plain_step);
  EXPECT_EQ(resolve(Budget::parse("40%")).bytes, 400);
  EXPECT_EQ(resolve(Budget::minimum()).bytes, 300);
  EXPECT_EQ(resolve(Budget::minimum()).smallest, 300);
  EXPECT_TRUE(resolve(Budget::bytes(1000)).fits_plain_step);
}

// The headroom is taken off a budget below the plain peak, never below the smallest plan's peak;
// the plain step fits its measured peak without it; the smallest budget includes it.
TEST(PlanBudgetTest, HeadroomLeavesAShareFreeBelowThePlainPeak) {
  BudgetLimits limits = kLimits;
  limits.headroom = 0.2;
  const auto resolve = [&](const Budget& budget) {
    return ckpt::detail::resolve_budget(budget, limits, false, error_naming_smallest());
  };
  EXPECT_EQ(ckpt::detail::smallest_budget(limits), 375);  // 300 / 0.8
  EXPECT_EQ(resolve(Budget::bytes(500)).solved_for, 400);
  EXPECT_EQ(resolve(Budget::bytes(375)).solved_for, 300);
  EXPECT_EQ(resolve(Budget::bytes(1000)).solved_for, 1000);
  limits.smallest_peak_bytes = 900;  // with its headroom above the plain peak: the plain peak
  EXPECT_EQ(ckpt::detail::smallest_budget(limits), 1000);
  limits.headroom = 0.5;
  EXPECT_THROW(ckpt::detail::smallest_budget(limits), c10::Error);
  limits.headroom = -0.1;
  EXPECT_THROW(ckpt::detail::smallest_budget(limits), c10::Error);
}

TEST(PlanBudgetTest, ABudgetNoPlanFitsIsTheErrorOrTheSmallestWithAWarning) {
  try {
    ckpt::detail::resolve_budget(Budget::bytes(200), kLimits, false, error_naming_smallest());
    ADD_FAILURE() << "no error";
  } catch (const ckpt::InfeasibleBudget& error) {
    EXPECT_EQ(error.smallest_feasible_bytes(), 300);
    EXPECT_NE(std::string(error.what()).find("no plan fits 200"), std::string::npos);
  }
  ckpt::test::WarningCapture warnings;
  const auto fallen =
      ckpt::detail::resolve_budget(Budget::bytes(200), kLimits,
                                   /*fall_back_to_minimum=*/true, error_naming_smallest());
  EXPECT_EQ(fallen.bytes, 300);
  EXPECT_TRUE(
      warnings.contains("ckpt::Test: no plan fits in a budget of 200 bytes; planning for "
                        "the smallest feasible budget, 300 bytes."));
  // A solver that answers any budget its own way: the budget stays as asked.
  const auto kept = ckpt::detail::resolve_budget(Budget::bytes(200), kLimits, false, {});
  EXPECT_EQ(kept.bytes, 200);
  EXPECT_EQ(kept.solved_for, 200);
}

c10::OutOfMemoryError out_of_memory() {
  return c10::OutOfMemoryError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                               "device out of memory");
}

TEST(PlanBudgetTest, PlanningForLessAsksBelowThePredictionAndNeverBelowTheSmallest) {
  c10::OutOfMemoryError error = out_of_memory();
  std::optional<int64_t> asked;
  ckpt::test::WarningCapture warnings;
  ckpt::detail::plan_for_less("ckpt::Test", error, false, /*held_bytes=*/int64_t{600}, 900, 800,
                              300, [&](int64_t budget) {
                                asked = budget;
                                return int64_t{550};
                              });
  ASSERT_TRUE(asked.has_value());
  EXPECT_LT(*asked, 800);
  EXPECT_GE(*asked, 300);
  EXPECT_TRUE(warnings.contains("ckpt::Test")) << ::testing::PrintToString(warnings.messages);
  // What it held was below the smallest: the smallest is asked for.
  ckpt::detail::plan_for_less("ckpt::Test", error, true, int64_t{100}, 900, 800, 300,
                              [&](int64_t budget) {
                                asked = budget;
                                return int64_t{300};
                              });
  EXPECT_EQ(*asked, 300);
}

TEST(PlanBudgetTest, PlanningForLessPassesTheErrorOnWhereNoPlanLeavesMoreRoom) {
  c10::OutOfMemoryError error = out_of_memory();
  try {
    ckpt::detail::plan_for_less("ckpt::Test", error, false, std::nullopt, 400, 300, 300,
                                [](int64_t) { return int64_t{300}; });
    ADD_FAILURE() << "no error";
  } catch (const c10::OutOfMemoryError& passed) {
    EXPECT_NE(std::string(passed.what()).find("device out of memory"), std::string::npos);
    EXPECT_NE(std::string(passed.what()).find("ckpt::Test"), std::string::npos) << passed.what();
  }
}

TEST(PlanBudgetTest, AChangedInputIsAnErrorWithAdviceOrAWarningThatItPlansAgain) {
  try {
    ckpt::detail::on_input_change("ckpt::Test", ckpt::InputChange::Error, "the input grew",
                                  "Plan with the largest.");
    ADD_FAILURE() << "no error";
  } catch (const c10::Error& error) {
    EXPECT_NE(std::string(error.what()).find("ckpt::Test: the input grew. Plan with the largest."),
              std::string::npos)
        << error.what();
  }
  ckpt::test::WarningCapture warnings;
  ckpt::detail::on_input_change("ckpt::Test", ckpt::InputChange::Replan, "the input grew", "");
  EXPECT_TRUE(warnings.contains("ckpt::Test: the input grew; planning again"));
}

}  // namespace plan_budget_test
