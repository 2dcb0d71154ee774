// ckpt::PlannedModel on an accelerator (the device suite): the profile measures device memory
// through the caching allocator's statistics and offers offloading; planned steps give the plain
// step's gradients to the bit, dropout included, and stay within the budget and the prediction.

#include <ckpt/ckpt.h>
#include <ckpt/memory_tracker.h>
#include <ckpt/planned_model.h>

#include "device/device_suite.h"
#include "support/forced_plan.h"
#include "support/residual_tower.h"

#include <functional>
#include <vector>

namespace {

using ckpt::test::bit_equal;
using ckpt::test::take_grads;

// Four residual blocks of two candidates each, dropout inside them.
using Tower = ckpt::test::ResidualTower;

class PlannedModelDeviceTest : public ckpt::test::DeviceTest {
 protected:
  Tower make_tower() const {
    torch::manual_seed(0);
    Tower tower;
    tower->to(device());
    return tower;
  }

  struct Step {
    std::vector<at::Tensor> grads;
    int64_t peak_bytes = 0;
  };

  // One step from no gradients and the same random state, its device peak above the start.
  Step step(Tower& tower, const std::function<at::Tensor()>& loss) const {
    for (auto& p : tower->parameters()) p.mutable_grad().reset();
    seed(1);
    ckpt::MemoryTracker tracker(device());
    const int64_t before = tracker.current_bytes();
    loss().backward();
    return {take_grads(*tower), tracker.peak_bytes() - before};
  }

  // The plain step of a fresh tower on `x`.
  Step plain_step(const at::Tensor& x) const {
    Tower tower = make_tower();
    return step(tower, [&] { return tower->forward(x).pow(2).mean(); });
  }

  // A planned step: the plain step's gradients to the bit, its peak within the budget and within
  // 2% of the prediction.
  void expect_like_plain(Tower& tower, ckpt::PlannedModel& planned,
                         const std::function<at::Tensor()>& loss, const Step& plain) const {
    const Step planned_step = step(tower, [&] { return planned.run(loss); });
    ASSERT_EQ(planned_step.grads.size(), plain.grads.size());
    for (size_t i = 0; i < plain.grads.size(); ++i) {
      EXPECT_TRUE(bit_equal(planned_step.grads[i], plain.grads[i])) << "gradient " << i;
    }
    const int64_t predicted = planned.solution().prediction.peak_bytes;
    EXPECT_LE(planned_step.peak_bytes, planned.budget_bytes()) << planned.summary();
    EXPECT_NEAR(static_cast<double>(planned_step.peak_bytes), static_cast<double>(predicted),
                0.02 * static_cast<double>(predicted))
        << planned.summary();
  }
};

TEST_P(PlannedModelDeviceTest, PlannedStepsGiveThePlainGradientsWithinTheBudget) {
  CKPT_SKIP_IF(missing_rng());
  CKPT_SKIP_IF(missing_memory_statistics());
  const at::Tensor x = torch::randn({128, 64}, on());
  const Step plain = plain_step(x);
  for (const char* budget : {"min", "70%"}) {
    SCOPED_TRACE(budget);
    Tower tower = make_tower();
    const auto loss = [&] { return tower->forward(x).pow(2).mean(); };
    ckpt::PlannedModel planned(tower, ckpt::Budget::parse(budget));
    planned.plan(loss);
    bool offers_offloading = false;
    for (const auto& c : planned.measured().profile.candidates) {
      for (const auto& option : c.options) offers_offloading |= option.name == "offloaded";
    }
    EXPECT_TRUE(offers_offloading);
    expect_like_plain(tower, planned, loss, plain);
  }
}

// A plan that mixes offloading, keeping, checkpointing and recomputing (the one the solver chose
// by timings now and then, 3.4% below its prediction until a recomputed candidate's bytes in its
// taker's backward were read where that backward begins).
TEST_P(PlannedModelDeviceTest, AMixedPlanRunsAtItsPrediction) {
  CKPT_SKIP_IF(missing_rng());
  CKPT_SKIP_IF(missing_memory_statistics());
  const at::Tensor x = torch::randn({128, 64}, on());
  const Step plain = plain_step(x);
  Tower tower = make_tower();
  const auto loss = [&] { return tower->forward(x).pow(2).mean(); };
  ckpt::MeasuredModel measured = ckpt::profile_model(tower.ptr(), loss);
  ckpt::test::only_plan({{"blocks.0.in", "offloaded"},
                         {"blocks.0.out", "stored"},
                         {"blocks.1.in", ckpt::kRecomputedMode},
                         {"blocks.1.out", "checkpointed"},
                         {"blocks.2.in", "offloaded"},
                         {"blocks.2.out", "stored"},
                         {"blocks.3.in", "stored"},
                         {"blocks.3.out", "stored"}})(measured);
  ckpt::PlannedModel planned(tower, ckpt::Budget::parse("100%"));
  planned.plan(std::move(measured));
  expect_like_plain(tower, planned, loss, plain);
}

CKPT_INSTANTIATE_DEVICE_SUITE(PlannedModelDeviceTest);

}  // namespace
