// Issue 27, item 7: a region with several outputs, then a separate backward through each (one
// loss per output), as plain autograd and PyTorch's non-reentrant checkpoint allow. The region
// keeps what its recompute needs until every output has had its backward or is gone.

#include <ckpt/checkpoint.h>

#include "support/support.h"

#include <tuple>

namespace separate_backwards_test {

using ckpt::test::bit_equal;
using ckpt::test::take_grads;

struct SeparateBackwardsTest : ckpt::test::SeedingFixture, ::testing::WithParamInterface<bool> {
  ckpt::CheckpointOptions options() const {
    return ckpt::CheckpointOptions().use_reentrant(GetParam());
  }
};

struct TwoHeadsImpl : torch::nn::Module {
  TwoHeadsImpl()
      : first(register_module("first", torch::nn::Linear(8, 8))),
        second(register_module("second", torch::nn::Linear(8, 8))) {}
  std::tuple<torch::Tensor, torch::Tensor> forward(const torch::Tensor& x) {
    return {torch::tanh(first(x)), torch::dropout(torch::sigmoid(second(x)), 0.5, true)};
  }
  torch::nn::Linear first, second;
};
TORCH_MODULE(TwoHeads);

TEST_P(SeparateBackwardsTest, EachOutputHasItsOwnBackward) {
  TwoHeads heads;
  const auto x = torch::randn({4, 8}, torch::requires_grad());
  torch::manual_seed(3);
  {
    auto [a, b] = heads->forward(x);
    a.pow(2).sum().backward();
    b.pow(2).sum().backward();
  }
  const auto expected_x = x.grad().clone();
  const auto expected = take_grads(*heads);
  x.mutable_grad().reset();

  torch::manual_seed(3);
  auto [a, b] = ckpt::checkpoint(options(), heads, x);
  a.pow(2).sum().backward();
  b.pow(2).sum().backward();
  EXPECT_TRUE(bit_equal(x.grad(), expected_x));
  const auto actual = take_grads(*heads);
  for (size_t i = 0; i < actual.size(); ++i) EXPECT_TRUE(bit_equal(actual[i], expected[i])) << i;
  // Each output's backward ran once: a second one through either is the usual error.
  CKPT_EXPECT_THROWS_WITH(a.sum().backward(), "second time");
  CKPT_EXPECT_THROWS_WITH(b.sum().backward(), "second time");
}

// The region lets go of its inputs once the other outputs are gone, as before.
TEST_P(SeparateBackwardsTest, StateIsFreedWhenTheOtherOutputsAreGone) {
  TwoHeads heads;
  const auto leaf = torch::randn({4, 8}, torch::requires_grad());
  for (const bool drop_second : {true, false}) {
    auto x = leaf * 2;  // a non-leaf: only the user and the region hold it
    auto [a, b] = ckpt::checkpoint(options(), heads, x);
    if (drop_second) b.reset();
    a.sum().backward();
    if (drop_second) {
      EXPECT_EQ(x.use_count(), 1);
    } else {
      EXPECT_GT(x.use_count(), 1);  // the region keeps it for b's backward
      b.sum().backward();
      EXPECT_EQ(x.use_count(), 1);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, SeparateBackwardsTest, ::testing::Values(false, true),
                         ckpt::test::VariantName());

}  // namespace separate_backwards_test
