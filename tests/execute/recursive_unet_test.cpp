// Issue 46, item 5: PlannedSequential on the outer chain of a recursive U-Net (pix2pix's
// generator: each block's Sequential holds the next block), as a real client planned it.

#include <ckpt/memory_tracker.h>
#include <ckpt/planned_sequential.h>

#include "support/support.h"

#include <algorithm>
#include <utility>

namespace recursive_unet_test {

namespace nn = torch::nn;

// One level of the U-Net: down, the inner levels, up; every level but the outermost returns its
// input beside its result (the skip connection). The ReLUs write into their input, as pix2pix's.
struct UNetLevelImpl : nn::Module {
  UNetLevelImpl(int64_t outer, int64_t inner, nn::AnyModule submodule, bool outermost) {
    const bool innermost = submodule.is_empty();
    const int64_t in = outermost ? 3 : outer;
    auto down = nn::Conv2d(nn::Conv2dOptions(in, inner, 4).stride(2).padding(1).bias(false));
    const int64_t up_in = innermost ? inner : inner * 2;
    auto up = nn::ConvTranspose2d(
        nn::ConvTranspose2dOptions(up_in, outermost ? 3 : outer, 4).stride(2).padding(1));
    if (!outermost) {
      body->push_back(nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.2).inplace(true)));
    }
    body->push_back(down);
    if (!outermost && !innermost) body->push_back(nn::BatchNorm2d(inner));
    if (!innermost) body->push_back(std::move(submodule));
    body->push_back(nn::ReLU(nn::ReLUOptions().inplace(true)));
    body->push_back(up);
    if (outermost) {
      body->push_back(nn::Tanh());
    } else {
      body->push_back(nn::BatchNorm2d(outer));
    }
    outermost_ = outermost;
    register_module("body", body);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return outermost_ ? body->forward(x) : torch::cat({x, body->forward(x)}, 1);
  }
  nn::Sequential body;
  bool outermost_ = false;
};
TORCH_MODULE(UNetLevel);

// Levels from the innermost out; channels double down to 8 × base.
UNetLevel make_unet(int levels, int64_t base) {
  nn::AnyModule inner;
  for (int level = levels - 1; level >= 1; --level) {
    const int64_t outer = base * (int64_t{1} << std::min(level, 3));
    const int64_t channels = base * (int64_t{1} << std::min(level + 1, 3));
    inner = nn::AnyModule(UNetLevel(outer, channels, inner, false));
  }
  return UNetLevel(base, base * 2, inner, true);
}

// The outer chain is three stages, the first holding every inner level: at its smallest budget
// nothing can be saved, and the plan keeps everything. The profile counted the gradients of the
// inner levels after that stage's backward, where the step makes most of them before its peak:
// it predicted 76% of the measured peak, and measuring the stage with every gradient buffer made
// in advance took the first step to 1.85 times the plain step's peak.
TEST(RecursiveUNetTest, OuterChainAtTheMinimumIsPredictedAndProfilesNearThePlainPeak) {
  torch::manual_seed(0);
  UNetLevel unet = make_unet(5, 16);
  const torch::Tensor x = torch::randn({2, 3, 64, 64});
  ckpt::MemoryTracker tracker;
  const auto step_peak = [&](auto&& run) {
    for (auto& p : unet->parameters()) p.mutable_grad().reset();  // as after zero_grad()
    tracker.reset_peak();
    const int64_t before = tracker.current_bytes();
    run(x).pow(2).mean().backward();
    return tracker.peak_bytes() - before;
  };
  const int64_t plain = step_peak([&](const torch::Tensor& t) { return unet->forward(t); });
  ckpt::PlannedSequential planned(unet->body, ckpt::Budget::minimum());
  const int64_t first = step_peak([&](const torch::Tensor& t) { return planned(t); });
  const int64_t planned_step = step_peak([&](const torch::Tensor& t) { return planned(t); });
  const int64_t predicted = planned->prediction().peak_bytes;
  EXPECT_NEAR(static_cast<double>(planned_step), static_cast<double>(predicted), 0.01 * predicted)
      << "measured " << planned_step << " predicted " << predicted;
  EXPECT_LE(planned_step, plain);
  // A measured stage lets go of its output and the output's gradient in its backward as the step
  // does: the first step peaked 1.09 times the plain step while both lived to the backward's end,
  // and 1.034 times while the first stage's checkpointed option held its output's gradient
  // through its recompute (an engine post-hook on the region's node); 1.001 times since. Issue
  // 48's bound is 1.02.
  EXPECT_LE(first, plain + plain / 50) << "first step " << first << ", plain step " << plain;
}

}  // namespace recursive_unet_test
