// The reentrant variant (use_reentrant(true)): the algorithm of the original PyTorch
// documentation, compared against the same computation without checkpointing.

#include <ckpt/checkpoint.h>

#include "support/support.h"

namespace checkpoint_reentrant_test {

using ckpt::test::bit_equal;
using ckpt::test::take_grads;

struct ReentrantCheckpointTest : ckpt::test::SeedingFixture {
  ckpt::CheckpointOptions reentrant = ckpt::CheckpointOptions().use_reentrant(true);
};

TEST_F(ReentrantCheckpointTest, GradientsMatchUncheckpointedRunBitForBit) {
  torch::nn::Sequential block(torch::nn::Linear(16, 32), torch::nn::ReLU(),
                              torch::nn::Linear(32, 16));
  auto x = torch::randn({8, 16}, torch::requires_grad());
  auto expected = block->forward(x);
  expected.sum().backward();
  auto expected_x = x.grad().clone();
  auto expected_params = take_grads(*block);
  x.mutable_grad() = torch::Tensor();

  auto actual = ckpt::checkpoint(reentrant, block, x);
  EXPECT_EQ(actual.grad_fn()->name(), "ckpt::CheckpointBackward(reentrant)");
  EXPECT_TRUE(bit_equal(actual, expected));
  actual.sum().backward();
  EXPECT_TRUE(bit_equal(x.grad(), expected_x));
  auto actual_params = take_grads(*block);
  for (size_t i = 0; i < actual_params.size(); ++i) {
    EXPECT_TRUE(bit_equal(actual_params[i], expected_params[i]));
  }
}

TEST_F(ReentrantCheckpointTest, ForwardRunsWithoutGradAndKeepsOnlyInputs) {
  bool grad_mode_in_forward = true;
  int calls = 0;
  auto fn = [&](const torch::Tensor& t) {
    if (++calls == 1) grad_mode_in_forward = torch::GradMode::is_enabled();
    return t.sin().exp();
  };
  auto x = torch::randn({4}, torch::requires_grad());
  auto y = ckpt::checkpoint(reentrant, fn, x);
  EXPECT_FALSE(grad_mode_in_forward);
  EXPECT_EQ(y.grad_fn()->num_outputs(), 1u);  // only the input's edge
  y.sum().backward();
  EXPECT_EQ(calls, 2);
  EXPECT_TRUE(ckpt::test::close(x.grad(), (x.sin().exp() * x.cos()).detach()));
}

TEST_F(ReentrantCheckpointTest, NestedReentrantRegions) {
  auto inner = [](const torch::Tensor& t) { return t.tanh() * 2; };
  auto outer = [&](const torch::Tensor& t) {
    return ckpt::checkpoint(ckpt::CheckpointOptions().use_reentrant(true), inner, t.sin()).cos();
  };
  auto x = torch::randn({5}, torch::requires_grad());
  auto expected = torch::autograd::grad({inner(x.sin()).cos().sum()}, {x})[0];
  ckpt::checkpoint(reentrant, outer, x).sum().backward();
  EXPECT_TRUE(bit_equal(x.grad(), expected));
}

TEST_F(ReentrantCheckpointTest, ParameterInTwoRegionsAccumulatesOncePerRegion) {
  // As in Python: the nested backward of each region accumulates into the parameter directly, so
  // a hook on it fires once per region (the non-reentrant variant fires it once in total).
  auto w = torch::randn({3}, torch::requires_grad());
  int hook_calls = 0;
  w.register_hook([&](const torch::Tensor& g) {
    ++hook_calls;
    return g;
  });
  auto fn = [&](const torch::Tensor& t) { return t * w; };
  auto x = torch::randn({3}, torch::requires_grad());
  auto y = ckpt::checkpoint(reentrant, fn, ckpt::checkpoint(reentrant, fn, x));
  y.sum().backward();
  EXPECT_EQ(hook_calls, 2);
  EXPECT_TRUE(ckpt::test::close(w.grad(), (2 * w * x).detach()));
}

}  // namespace checkpoint_reentrant_test
