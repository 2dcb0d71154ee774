// The chain profiler on an accelerator: what it times.

#include <ckpt/memory_tracker.h>
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

// A stage's parameter gradients (and the chain's activations) as the device holds them: on the
// quick bench transformer on the emulated device, counting a LayerNorm's 64-byte bias as 64 bytes
// where its gradient takes a 512-byte block put the smallest plan 5.9 KB (16%) above its
// prediction.
TEST_P(ProfilerDeviceTest, SizesAreWhatTheDeviceHolds) {
  torch::nn::LayerNorm norm(torch::nn::LayerNormOptions({16}));
  torch::nn::Linear linear(16, 24);
  norm->to(device());
  linear->to(device());
  const auto x = torch::randn({4, 16}, torch::TensorOptions().device(device()));
  const ckpt::plan::Chain chain =
      ckpt::profile_chain({torch::nn::AnyModule(norm), torch::nn::AnyModule(linear)}, x,
                          ckpt::ProfileOptions().repeats(1).warmup(0).calibrate_to_step(false));
  const auto held_by_gradients = [&](torch::nn::Module& stage, const at::Tensor& input) {
    for (auto& p : stage.parameters()) p.mutable_grad().reset();
    const auto output = stage.as<torch::nn::LayerNormImpl>() ? norm(input) : linear(input);
    const auto gradient = torch::ones_like(output);
    ckpt::MemoryTracker tracker(device());
    const int64_t before = tracker.current_bytes();
    // The graph kept: what its saved tensors give back would hide the gradients' blocks.
    torch::autograd::backward({output}, {gradient}, /*retain_graph=*/true,
                              /*create_graph=*/false, {stage.parameters()});
    return tracker.current_bytes() - before;
  };
  EXPECT_EQ(chain.stages[0].gradient_bytes, held_by_gradients(*norm, x));
  EXPECT_EQ(chain.stages[1].gradient_bytes, held_by_gradients(*linear, norm(x).detach()));
  // The input and the outputs (a 4x24 output: 384 bytes in a 512-byte block) likewise.
  ckpt::MemoryTracker tracker(device());
  const int64_t before = tracker.current_bytes();
  const torch::NoGradGuard no_grad;
  const at::Tensor copy = x.clone();
  const int64_t input_block = tracker.current_bytes() - before;
  const at::Tensor output = linear(copy);
  EXPECT_EQ(chain.input_bytes, input_block);
  EXPECT_EQ(chain.stages[1].output_bytes, tracker.current_bytes() - before - input_block);
}

CKPT_INSTANTIATE_DEVICE_SUITE(ProfilerDeviceTest);

}  // namespace profiler_device_test
