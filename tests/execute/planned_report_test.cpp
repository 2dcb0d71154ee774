// Issue 33, item 6: what each stage of a PlannedSequential's forward keeps (ckpt::KeptReport), in
// the storage its schedule gives it; the total equals what MemoryTracker measures.

#include <ckpt/memory_tracker.h>
#include <ckpt/planned_sequential.h>
#include <ckpt/report.h>

#include "support/support.h"

#include <set>
#include <string>

namespace planned_report_test {

struct PlannedReportTest : ckpt::test::SeedingFixture,
                           ::testing::WithParamInterface<const char*> {};

// Stages with dropout, so that stages that run again stash RNG state.
torch::nn::Sequential make_chain(int layers, int64_t width) {
  torch::nn::Sequential chain;
  for (int i = 0; i < layers; ++i) {
    chain->push_back(torch::nn::Linear(width, width));
    chain->push_back(torch::nn::Dropout(0.1));
    chain->push_back(torch::nn::Tanh());
  }
  return chain;
}

TEST_P(PlannedReportTest, EachStageReportsWhatItKeepsAsTheTrackerMeasures) {
  auto chain = make_chain(6, 64);
  ckpt::PlannedSequential planned(
      chain, ckpt::Budget::parse(GetParam()),
      ckpt::PlannedSequentialOptions().count_parameter_gradients(false));
  ckpt::MemoryTracker tracker(c10::Device(c10::kCPU), ckpt::MemoryScope::CallingThread);
  const int64_t before = tracker.current_bytes();
  ckpt::KeptReport report;
  torch::Tensor y;
  {
    auto x = torch::randn({32, 64}, torch::requires_grad());
    planned->plan(x);  // planning inside the scope would record nothing either (see below)
    const int64_t planned_bytes = tracker.current_bytes() - before;
    ckpt::ReportScope scope(report);
    y = planned(x);
    x.reset();  // the executor holds the chain's input until the backward
    EXPECT_EQ(report.kept_bytes(), tracker.current_bytes() - before - planned_bytes -
                                       static_cast<int64_t>(y.storage().nbytes()) + 32 * 64 * 4);
  }
  std::set<std::string> stages, modes;
  for (const auto& region : report.regions()) {
    stages.insert(region.stage);
    modes.insert(region.mode);
    EXPECT_FALSE(region.mode.empty()) << region.name;
  }
  std::set<std::string> expected;
  for (size_t i = 0; i < planned->profile().stages.size(); ++i)
    expected.insert("stage " + std::to_string(i));
  EXPECT_EQ(stages, expected);
  if (std::string(GetParam()) == "100%") {
    EXPECT_EQ(modes, std::set<std::string>{"plain"});
  } else {
    EXPECT_GT(modes.size(), 1u);  // the minimum budget mixes storage
  }
  y.sum().backward();
}

INSTANTIATE_TEST_SUITE_P(Budgets, PlannedReportTest, ::testing::Values("min", "100%"),
                         [](const ::testing::TestParamInfo<const char*>& budget) {
                           return std::string(budget.param) == "min" ? "Minimum" : "Everything";
                         });

TEST(PlannedReportPlanningTest, PlanningInsideTheScopeRecordsOnlyTheForward) {
  torch::manual_seed(0);
  ckpt::PlannedSequential planned(
      make_chain(4, 32), ckpt::Budget::parse("min"),
      ckpt::PlannedSequentialOptions().count_parameter_gradients(false));
  ckpt::KeptReport report;
  torch::Tensor y;
  {
    ckpt::ReportScope scope(report);
    y = planned(torch::randn({8, 32}, torch::requires_grad()));  // profiles, solves, runs
  }
  y.sum().backward();
  ASSERT_FALSE(report.regions().empty());
  for (const auto& region : report.regions()) EXPECT_FALSE(region.stage.empty()) << region.name;
}

}  // namespace planned_report_test
