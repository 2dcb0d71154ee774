// The chain profiler on an accelerator: what it times.

#include <ckpt/profiler.h>

#include "device/device_suite.h"

#include <chrono>
#include <thread>

namespace profiler_device_test {

// A linear layer whose first call is slow, as a kernel's first launch on a GPU is (its code
// loaded, its algorithm picked): later calls are not.
struct SlowFirstCallImpl : torch::nn::Module {
  SlowFirstCallImpl() : linear(register_module("linear", torch::nn::Linear(16, 16))) {}
  at::Tensor forward(const at::Tensor& x) {
    if (calls++ == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    return linear(x);
  }
  torch::nn::Linear linear;
  int calls = 0;
};
TORCH_MODULE(SlowFirstCall);

class ProfilerDeviceTest : public ckpt::test::DeviceTest {
 protected:
  void SetUp() override {
    DeviceTest::SetUp();
    if (IsSkipped()) return;
    CKPT_SKIP_IF(missing_memory_statistics());  // profile_chain measures memory too
  }
};

// On an H200, ResNet's plain stages were timed with their kernels' first launches, and the
// planner predicted recomputing plans at a tenth of the plain step's time.
TEST_P(ProfilerDeviceTest, StagesAreTimedAfterTheirFirstCall) {
  SlowFirstCall first;
  torch::nn::Linear second(16, 16);
  first->to(device());
  second->to(device());
  const auto x = torch::randn({4, 16}, torch::TensorOptions().device(device()));
  const ckpt::plan::Chain chain =
      ckpt::profile_chain({torch::nn::AnyModule(first), torch::nn::AnyModule(second)}, x,
                          ckpt::ProfileOptions().repeats(1).warmup(0).calibrate_to_step(false));
  EXPECT_GE(first->calls, 2);
  for (const ckpt::plan::Stage& stage : chain.stages) {
    EXPECT_LT(stage.forward_time, 0.1);
    EXPECT_LT(stage.forward_all_time, 0.1);
    for (const auto& option : stage.alternatives) EXPECT_LT(option.forward_time, 0.1);
  }
}

CKPT_INSTANTIATE_DEVICE_SUITE(ProfilerDeviceTest);

}  // namespace profiler_device_test
