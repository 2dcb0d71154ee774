// The chain profiler on an accelerator: what it times.

#include <ckpt/memory_tracker.h>
#include <ckpt/profiler.h>

#include "device/device_suite.h"
#include "support/dropout_block.h"
#include "support/linear_blocks.h"
#include "support/same_sizes.h"

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

// Repeated stages measured once (ProfileOptions::reuse_repeated_stages) get the sizes measuring
// each gives on the device too, where blocks are rounded to 512 bytes and the first stage of a kind
// runs once before its measure: dropout's draws, and a weight used twice in a stage.
TEST_P(ProfilerDeviceTest, RepeatedStagesProfileAsMeasuredOnes) {
  std::vector<torch::nn::AnyModule> stages;
  for (int i = 0; i < 3; ++i) {
    ckpt::test::DropoutBlock block;
    block->to(device());
    stages.emplace_back(block);
  }
  for (int i = 0; i < 2; ++i) {
    ckpt::test::NormalisedLinear block(64);
    block->to(device());
    stages.emplace_back(block);
  }
  const auto x = torch::randn({6, 64}, torch::TensorOptions().device(device()));
  const auto options = [](bool reuse) {
    return ckpt::ProfileOptions()
        .storage_modes(ckpt::StorageModes::standard())
        .reuse_repeated_stages(reuse);
  };
  const ckpt::plan::Chain reused = ckpt::profile_chain(stages, x, options(true));
  ckpt::test::expect_same_sizes(reused, ckpt::profile_chain(stages, x, options(false)));
  // Taken over, times and all (the first block's input needs no gradient: a kind of its own).
  EXPECT_EQ(reused.stages[2].backward_time, reused.stages[1].backward_time);
  EXPECT_EQ(reused.stages[4].backward_time, reused.stages[3].backward_time);
}

CKPT_INSTANTIATE_DEVICE_SUITE(ProfilerDeviceTest);

}  // namespace profiler_device_test
