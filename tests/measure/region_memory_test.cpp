// Memory of checkpointed regions, measured with the counting allocator: after the forward a
// region keeps no more than its input and output; backward's peak includes the recompute;
// memory drops step by step during the backward of the recomputed graph.

#include <ckpt/checkpoint.h>
#include <ckpt/memory_tracker.h>
#include <ckpt/selective.h>

#include "support/support.h"

namespace region_memory_test {

constexpr int64_t kBatch = 64;
constexpr int64_t kWidth = 256;
constexpr int64_t kActivationBytes = kBatch * kWidth * 4;

torch::nn::Sequential make_deep(int layers) {
  torch::nn::Sequential model;
  for (int i = 0; i < layers; ++i) {
    model->push_back(torch::nn::Linear(kWidth, kWidth));
    model->push_back(torch::nn::Tanh());
  }
  return model;
}

struct RegionMemoryTest : ckpt::test::SeedingFixture, ::testing::WithParamInterface<bool> {
  ckpt::CheckpointOptions options() const {
    return ckpt::CheckpointOptions().use_reentrant(GetParam());
  }
};

TEST_P(RegionMemoryTest, TwentyFourLayerRegionKeepsOnlyInputAndOutput) {
  ckpt::MemoryTracker tracker;
  auto model = make_deep(24);
  auto x = torch::randn({kBatch, kWidth}, torch::requires_grad());

  const int64_t before_plain = tracker.current_bytes();
  int64_t kept_plain = 0;
  {
    auto y = model->forward(x);
    kept_plain = tracker.current_bytes() - before_plain;
  }

  const int64_t before = tracker.current_bytes();
  auto y = ckpt::checkpoint(options(), model, x);
  const int64_t kept = tracker.current_bytes() - before;
  // The output, plus the stashed CPU RNG state (about 5 KB).
  EXPECT_LE(kept, kActivationBytes + 8 * 1024);
  EXPECT_GE(kept, kActivationBytes);
  EXPECT_GE(kept_plain, 24 * kActivationBytes);

  tracker.reset_peak();
  const int64_t before_backward = tracker.current_bytes();
  y.sum().backward();
  const int64_t backward_peak = tracker.peak_bytes() - before_backward;
  // The recompute rebuilds what the plain forward kept.
  EXPECT_GE(backward_peak, kept_plain - kActivationBytes);
}

// Parameters as large as the activations: the region must not hold their gradients until its
// backward ends (it accumulates each in place as soon as it is ready, like plain autograd).
TEST_P(RegionMemoryTest, BackwardPeakMatchesAPlainBackwardOfTheRecompute) {
  auto model = make_deep(16);
  for (auto& p : model->parameters()) p.mutable_grad() = torch::zeros_like(p);
  auto x = torch::randn({kBatch, kWidth}, torch::requires_grad());
  ckpt::MemoryTracker tracker;
  auto backward_peak = [&](bool checkpointed) {
    auto y = checkpointed ? ckpt::checkpoint(options(), model, x) : model->forward(x);
    tracker.reset_peak();
    const int64_t before = tracker.current_bytes();
    y.sum().backward();
    return tracker.peak_bytes() - before;
  };
  const int64_t plain_forward_kept = [&] {
    const int64_t before = tracker.current_bytes();
    auto y = model->forward(x);
    return tracker.current_bytes() - before;
  }();
  const int64_t plain = backward_peak(false);
  const int64_t checkpointed = backward_peak(true);
  // The recompute rebuilds what the plain forward kept, then backward runs as in the plain case.
  EXPECT_LE(checkpointed, plain_forward_kept + plain + 64 * 1024)
      << "plain backward " << plain << ", kept " << plain_forward_kept;
}

// Issue 29, item 4: with the gradient buffers kept between steps (zero_grad(false), gradient
// accumulation), regions nested in another held every inner parameter's gradient until the outer
// region's backward ended (1.5 times the plain step's peak on a U-Net). Each is added into its
// buffer as soon as it is ready, as without checkpointing, and the step's peak stays below the
// plain step's.
TEST_P(RegionMemoryTest, NestedRegionsWithGradientBuffersPeakNoHigherThanThePlainStep) {
  std::vector<torch::nn::Sequential> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(make_deep(4));
  for (auto& block : blocks) {
    for (auto& p : block->parameters()) p.mutable_grad() = torch::zeros_like(p);
  }
  const auto x = torch::randn({8, kWidth}, torch::requires_grad());  // activations << weights
  const auto run_blocks = [&](const torch::Tensor& t, bool inner_regions) {
    torch::Tensor h = t;
    for (auto& block : blocks) {
      h = inner_regions ? ckpt::checkpoint(options(), block, h) : block->forward(h);
    }
    return h;
  };
  ckpt::MemoryTracker tracker;
  const auto step_peak = [&](bool checkpointed) {
    tracker.reset_peak();
    const int64_t before = tracker.current_bytes();
    auto y = checkpointed
                 ? ckpt::checkpoint(
                       options(), [&](const torch::Tensor& t) { return run_blocks(t, true); }, x)
                 : run_blocks(x, false);
    y.sum().backward();
    return tracker.peak_bytes() - before;
  };
  const auto grads = [&] {
    std::vector<torch::Tensor> all;
    for (auto& block : blocks) {
      for (auto& p : block->parameters()) all.push_back(p.grad().clone());
    }
    return all;
  };
  const int64_t plain = step_peak(false);
  const auto expected = grads();  // accumulated onto the zero buffers, as the region's will be
  for (auto& block : blocks) {
    for (auto& p : block->parameters()) p.mutable_grad().zero_();
  }
  const int64_t checkpointed = step_peak(true);
  RecordProperty("plain_peak_bytes", std::to_string(plain));
  RecordProperty("checkpointed_peak_bytes", std::to_string(checkpointed));
  EXPECT_LE(checkpointed, plain) << "one layer's weight gradient: " << kWidth * kWidth * 4;
  const auto actual = grads();
  for (size_t i = 0; i < actual.size(); ++i) {
    EXPECT_TRUE(ckpt::test::bit_equal(actual[i], expected[i])) << "parameter " << i;
  }
}

// The region's forward lets go of each node's saved tensors as soon as the next operator consumes
// its output, as PyTorch's pack hooks drop them: its peak is the kept outputs (none without a
// policy) and a few live activations, not every activation the forward's graph would save.
TEST(RegionSelectiveMemoryTest, ForwardHoldsTheKeptOutputsNotTheGraphsActivations) {
  ckpt::MemoryTracker tracker;
  auto model = make_deep(24);
  auto x = torch::randn({kBatch, kWidth}, torch::requires_grad());
  const auto forward_peak = [&](const ckpt::CheckpointOptions& options) {
    tracker.reset_peak();
    const int64_t before = tracker.current_bytes();
    auto y = ckpt::checkpoint(options, model, x);
    return tracker.peak_bytes() - before;
  };
  const ckpt::SelectivePolicy keep_nothing(
      [](const ckpt::OpCall&) { return ckpt::CheckpointPolicy::PreferRecompute; });
  // Each layer's graph saves tanh's output, which is also the next product's saved input: the
  // default variant held all 24 until its function returned, before it let go of them too.
  EXPECT_LE(forward_peak(ckpt::CheckpointOptions()), 4 * kActivationBytes);
  EXPECT_LE(forward_peak(ckpt::CheckpointOptions().policy(keep_nothing)), 4 * kActivationBytes);
  // save_matmuls() keeps the 24 products (their bias added in place) and little else.
  const int64_t matmuls = forward_peak(ckpt::CheckpointOptions().policy(ckpt::save_matmuls()));
  EXPECT_GE(matmuls, 24 * kActivationBytes);
  EXPECT_LE(matmuls, 28 * kActivationBytes);
}

INSTANTIATE_TEST_SUITE_P(Variants, RegionMemoryTest, ::testing::Values(false, true),
                         ckpt::test::VariantName());

// Port of test_checkpointing_without_reentrant_early_free (GPU memory → counting allocator).
// Hooks inside the function record live bytes as the backward passes each intermediate.
std::vector<int64_t> bytes_at_hooks(bool checkpointed, bool retain_graph) {
  ckpt::MemoryTracker tracker;
  std::vector<int64_t> stats;
  auto fn = [&](const torch::Tensor& input) {
    auto x = input;
    for (int i = 0; i < 4; ++i) {
      x = x.pow(2);
      if (i < 3) {
        x.register_hook([&](const torch::Tensor& g) {
          stats.push_back(tracker.current_bytes());
          return g;
        });
      }
    }
    return x.sum();
  };
  auto x = torch::zeros({1 << 16}, torch::requires_grad());
  x.mutable_grad() = torch::zeros_like(x);
  auto out = checkpointed ? ckpt::checkpoint(fn, x) : fn(x);
  out.backward({}, retain_graph);
  return stats;
}

TEST(RegionEarlyFreeTest, MemoryDropsAtEachStepOfTheBackward) {
  for (bool retain : {false, true}) {
    auto stats = bytes_at_hooks(/*checkpointed=*/true, retain);
    ASSERT_EQ(stats.size(), 3u);
    EXPECT_GT(stats[0], stats[1]) << "retain_graph=" << retain;
    EXPECT_GT(stats[1], stats[2]) << "retain_graph=" << retain;
  }
  auto plain_retained = bytes_at_hooks(/*checkpointed=*/false, /*retain_graph=*/true);
  ASSERT_EQ(plain_retained.size(), 3u);
  EXPECT_EQ(plain_retained[0], plain_retained[1]);
  EXPECT_EQ(plain_retained[1], plain_retained[2]);
}

}  // namespace region_memory_test
