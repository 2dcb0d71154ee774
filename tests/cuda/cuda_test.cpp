// ckpt on a CUDA device: RNG and autocast replay, the caching allocator's statistics, and planning
// from GPU memory. Each test skips itself without a GPU; scripts/gpu-check.sh runs them on one.

#include <ckpt/ckpt.h>
#include <ckpt/memory_tracker.h>
#include <ckpt/planned_sequential.h>

#include "support/support.h"

namespace {

using ckpt::test::bit_equal;

torch::TensorOptions on_cuda() {
  return torch::TensorOptions().device(torch::kCUDA);
}

TEST(CudaTest, DropoutGradientsMatch_CUDA) {
  // Port of test_checkpoint_rng_gpu: the CUDA generator is stashed and replayed.
  CKPT_SKIP_WITHOUT_CUDA();
  auto inp = torch::randn({20000}, on_cuda()).requires_grad_();
  torch::nn::Dropout phase1, phase2;
  at::Generator generator = ckpt::compat::default_generator(c10::Device(c10::DeviceType::CUDA, 0));
  auto cuda_state = generator.get_state();
  auto out = ckpt::checkpoint(phase2, phase1(inp));
  out.sum().backward();
  auto g1 = inp.grad().clone();
  generator.set_state(cuda_state);
  inp.mutable_grad() = torch::Tensor();
  phase2(phase1(inp)).sum().backward();
  EXPECT_TRUE(bit_equal(g1, inp.grad()));
}

TEST(CudaTest, AutocastIsReplayedInTheRecompute_CUDA) {
  CKPT_SKIP_WITHOUT_CUDA();
  torch::nn::Linear layer(64, 64);
  layer->to(torch::kCUDA);
  auto x = torch::randn({8, 64}, on_cuda()).requires_grad_();
  auto run = [&](bool checkpointed) {
    layer->zero_grad();
    x.mutable_grad() = torch::Tensor();
    at::Tensor y;
    {
      // Autocast on for the forward only: the recompute, in backward, must replay it.
      ckpt::compat::set_autocast_enabled(c10::DeviceType::CUDA, true);
      y = checkpointed ? ckpt::checkpoint(layer, x) : layer(x);
      ckpt::compat::set_autocast_enabled(c10::DeviceType::CUDA, false);
    }
    EXPECT_EQ(y.scalar_type(), torch::kHalf);
    y.to(torch::kFloat).pow(2).sum().backward();
    return std::make_pair(x.grad().clone(), layer->weight.grad().clone());
  };
  auto plain = run(false);
  auto checkpointed = run(true);
  EXPECT_TRUE(bit_equal(plain.first, checkpointed.first));
  EXPECT_TRUE(bit_equal(plain.second, checkpointed.second));
}

TEST(CudaTest, MemoryTrackerReadsTheCachingAllocator_CUDA) {
  CKPT_SKIP_WITHOUT_CUDA();
  ckpt::MemoryTracker tracker(torch::kCUDA);
  EXPECT_EQ(tracker.device(), c10::Device(c10::DeviceType::CUDA, 0));
  const int64_t before = tracker.current_bytes();
  {
    auto t = torch::empty({1 << 20}, on_cuda());  // 4 MiB, a multiple of the allocator's rounding
    EXPECT_EQ(tracker.current_bytes() - before, 4 << 20);
  }
  EXPECT_EQ(tracker.current_bytes(), before);
  EXPECT_EQ(tracker.peak_bytes() - before, 4 << 20);
  tracker.reset_peak();
  EXPECT_EQ(tracker.peak_bytes(), before);
}

TEST(CudaTest, CheckpointKeepsNoActivationsOnTheDevice_CUDA) {
  CKPT_SKIP_WITHOUT_CUDA();
  torch::nn::Sequential block;
  for (int i = 0; i < 8; ++i) block->push_back(torch::nn::Linear(512, 512));
  block->to(torch::kCUDA);
  auto x = torch::randn({256, 512}, on_cuda()).requires_grad_();
  ckpt::MemoryTracker tracker(torch::kCUDA);
  auto kept_after_forward = [&](bool checkpointed) {
    const int64_t before = tracker.current_bytes();
    auto y = checkpointed ? ckpt::checkpoint(block, x) : block->forward(x);
    return tracker.current_bytes() - before;
  };
  const int64_t plain = kept_after_forward(false);
  const int64_t checkpointed = kept_after_forward(true);
  const int64_t output = 256 * 512 * 4;
  EXPECT_GE(plain, 8 * output);
  EXPECT_LT(checkpointed, 2 * output);
}

TEST(CudaTest, PlannedSequentialPlansFromDeviceMemory_CUDA) {
  CKPT_SKIP_WITHOUT_CUDA();
  torch::manual_seed(0);
  torch::nn::Sequential model;
  for (int i = 0; i < 8; ++i) {
    model->push_back(torch::nn::Linear(256, 256));
    model->push_back(torch::nn::Dropout(0.1));
    model->push_back(torch::nn::GELU());
  }
  model->to(torch::kCUDA);
  auto x = torch::randn({128, 256}, on_cuda()).requires_grad_();
  ckpt::PlannedSequential planned(model, ckpt::Budget::parse("40%"));
  planned->plan(x);
  EXPECT_GT(planned->profile().input_bytes, 0);
  EXPECT_LE(planned->prediction().peak_bytes, planned->budget_bytes());

  auto step = [&](auto&& forward) {
    model->zero_grad();
    x.mutable_grad() = torch::Tensor();
    torch::manual_seed(7);  // seeds the CUDA generator too: same dropout masks in both runs
    forward(x).pow(2).sum().backward();
    std::vector<at::Tensor> grads{x.grad().clone()};
    for (const auto& p : model->parameters()) grads.push_back(p.grad().clone());
    return grads;
  };
  auto plain = step([&](const at::Tensor& t) { return model->forward(t); });
  ckpt::MemoryTracker tracker(torch::kCUDA);
  const int64_t before = tracker.current_bytes();
  auto ours = step([&](const at::Tensor& t) { return planned(t); });
  ASSERT_EQ(plain.size(), ours.size());
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(bit_equal(plain[i], ours[i])) << i;
  EXPECT_GT(tracker.peak_bytes() - before, 0);
}

}  // namespace
