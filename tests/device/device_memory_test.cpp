// ckpt measuring device memory (the device suite): MemoryTracker on the device's allocator
// statistics, what a region keeps on the device, and PlannedSequential planned from device memory
// (its measured peak at the prediction and within the budget).

#include <ckpt/ckpt.h>
#include <ckpt/memory_tracker.h>
#include <ckpt/planned_sequential.h>

#include "device/device_suite.h"

namespace device_memory_test {

class DeviceMemoryTest : public ckpt::test::DeviceTest {
 protected:
  void SetUp() override {
    DeviceTest::SetUp();
    if (IsSkipped()) return;
    CKPT_SKIP_IF(missing_memory_statistics());
  }
};

TEST_P(DeviceMemoryTest, MemoryTrackerReadsTheDevicesAllocator) {
  ckpt::MemoryTracker tracker(type());  // no index: device 0
  EXPECT_EQ(tracker.device(), device(0));
  const int64_t before = tracker.current_bytes();
  {
    const auto t = torch::empty({1 << 20}, on());  // 4 MiB, a multiple of the allocators' rounding
    EXPECT_EQ(tracker.current_bytes() - before, 4 << 20);
  }
  EXPECT_EQ(tracker.current_bytes(), before);
  EXPECT_EQ(tracker.peak_bytes() - before, 4 << 20);
  tracker.reset_peak();
  EXPECT_EQ(tracker.peak_bytes(), before);
}

TEST_P(DeviceMemoryTest, PeakBreakdownIsRefusedWithAClearError) {
  ckpt::MemoryTracker tracker(device());
  CKPT_EXPECT_THROWS_WITH(tracker.record_breakdown(), "keeps statistics, not blocks");
  CKPT_EXPECT_THROWS_WITH(tracker.peak_breakdown({}), "call record_breakdown() before the step");
}

TEST_P(DeviceMemoryTest, CheckpointKeepsNoActivationsOnTheDevice) {
  torch::nn::Sequential block;
  for (int i = 0; i < 8; ++i) block->push_back(torch::nn::Linear(512, 512));
  block->to(device());
  const auto x = torch::randn({256, 512}, on()).requires_grad_();
  ckpt::MemoryTracker tracker(device());
  const auto kept_after_forward = [&](bool checkpointed) {
    const int64_t before = tracker.current_bytes();
    const auto y = checkpointed ? ckpt::checkpoint(block, x) : block->forward(x);
    return tracker.current_bytes() - before;
  };
  const int64_t plain = kept_after_forward(false);
  const int64_t checkpointed = kept_after_forward(true);
  const int64_t output = 256 * 512 * 4;
  EXPECT_GE(plain, 8 * output);
  EXPECT_LT(checkpointed, 2 * output);
}

// Three budgets from the chain's smallest feasible one up to its plain step's peak: each step's
// measured device peak is within 2% of the prediction and within the budget. The step ends in a
// loss that keeps nothing of the chain's output and materializes its gradient, as the planner's
// model has it (docs/memory-model.md); its two scalars (the loss and the gradient autograd seeds
// it with) are the caller's.
TEST_P(DeviceMemoryTest, PlannedSequentialPeakFollowsThePredictionAtThreeBudgets) {
  const int64_t batch = 64, width = 256;
  torch::nn::Sequential chain;
  for (int i = 0; i < 16; ++i) {
    chain->push_back(torch::nn::Linear(width, width));
    chain->push_back(torch::nn::Tanh());
  }
  chain->to(device());
  // The gradients live between steps (zero_grad(false)): the plan is for what a step adds.
  const auto options = ckpt::PlannedSequentialOptions().count_parameter_gradients(false);
  for (auto& p : chain->parameters()) p.mutable_grad() = torch::zeros_like(p);
  // The input requires grad, as in the model (its gradient δ_0 is a buffer of the step).
  const auto x = torch::randn({batch, width}, on()).requires_grad_();
  const auto target = torch::randn({batch, width}, on());
  ckpt::PlannedSequential probe(chain, ckpt::Budget::minimum(), options);
  probe->plan(x);
  const int64_t smallest = probe->budget_bytes();
  const int64_t plain = probe->no_checkpoint_peak_bytes();
  ASSERT_LT(smallest, plain);
  for (const double fraction : {0.0, 0.4, 0.8}) {
    SCOPED_TRACE(fraction);
    const auto budget = smallest + static_cast<int64_t>(fraction * (plain - smallest));
    ckpt::PlannedSequential planned(chain, ckpt::Budget::bytes(budget), options);
    planned->plan(x);
    x.mutable_grad().reset();
    ckpt::test::expect_step_peak_as_predicted(planned, x, target);
  }
}

CKPT_INSTANTIATE_DEVICE_SUITE(DeviceMemoryTest);

}  // namespace device_memory_test
