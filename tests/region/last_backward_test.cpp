// A region's last backward lets go of its arguments once its recompute has run: what the recompute
// saved of them its graph holds, and the rest (an argument that only a concatenation or an addition
// reads, as a U-Net decoder's skip) is freed before the backward runs through the recomputed
// graph instead of after it. A backward that may come again keeps them: retain_graph, another
// output still to have its own backward, a graph made for a double backward.

#include <ckpt/checkpoint.h>

#include "support/support.h"

#include <c10/core/StorageImpl.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/autograd/autograd.h>

#include <memory>
#include <tuple>

namespace last_backward_test {

using ckpt::test::bit_equal;

struct LastBackwardTest : ckpt::test::SeedingFixture {};

// Whether the skip's storage was gone when a backward reached the concatenation.
struct Watch {
  c10::weak_intrusive_ptr<c10::StorageImpl> skip{c10::intrusive_ptr<c10::StorageImpl>()};
  std::shared_ptr<int> freed = std::make_shared<int>(-1);  // -1: no backward reached it
};

// (exp(cat(x, skip)) * 2, tanh(cat(x, skip))), noting in `watch` at each backward through the
// concatenation whether the skip is freed.
std::tuple<torch::Tensor, torch::Tensor> decoder(const torch::Tensor& x, const torch::Tensor& skip,
                                                 const Watch& watch) {
  auto joined = torch::cat({x, skip});
  joined.register_hook([watch](const torch::Tensor&) { *watch.freed = watch.skip.expired(); });
  return {torch::exp(joined) * 2, torch::tanh(joined)};
}

struct Step {
  torch::Tensor x, skip_source;
  torch::Tensor first, second;  // the outputs
  Watch watch;
};

// The decoder on copies of `x` and `s`, its skip made from the copy of `s` so that only the call
// holds it: checkpointed, or plainly.
Step run(const torch::Tensor& x, const torch::Tensor& s, bool checkpointed) {
  Step step;
  step.x = x.detach().clone().requires_grad_();
  step.skip_source = s.detach().clone().requires_grad_();
  const torch::Tensor skip = step.skip_source * 3;
  step.watch.skip = c10::weak_intrusive_ptr<c10::StorageImpl>(skip.storage().getWeakStorageImpl());
  const Watch watch = step.watch;
  if (checkpointed) {
    std::tie(step.first, step.second) = ckpt::checkpoint(
        [watch](const torch::Tensor& a, const torch::Tensor& b) { return decoder(a, b, watch); },
        step.x, skip);
  } else {
    std::tie(step.first, step.second) = decoder(step.x, skip, watch);
  }
  return step;
}

void expect_same_gradients(const Step& plain, const Step& step) {
  EXPECT_TRUE(bit_equal(plain.x.grad(), step.x.grad()));
  EXPECT_TRUE(bit_equal(plain.skip_source.grad(), step.skip_source.grad()));
}

TEST_F(LastBackwardTest, AnArgumentOnlyConcatenatedIsFreedOnceTheRecomputeRan) {
  const auto x = torch::randn({4096}), s = torch::randn({4096});
  Step plain = run(x, s, false);
  (plain.first.sum() + plain.second.sum()).backward();
  EXPECT_EQ(*plain.watch.freed, 1);  // plain autograd saves none of it: gone after the forward
  Step step = run(x, s, true);
  EXPECT_FALSE(step.watch.skip.expired());  // the region holds it for its recompute
  (step.first.sum() + step.second.sum()).backward();
  EXPECT_EQ(*step.watch.freed, 1);
  expect_same_gradients(plain, step);
}

TEST_F(LastBackwardTest, RetainGraphKeepsThemForTheNextBackward) {
  const auto x = torch::randn({4096}), s = torch::randn({4096});
  Step plain = run(x, s, false);
  Step step = run(x, s, true);
  for (Step* each : {&plain, &step}) {
    (each->first.sum() + each->second.sum()).backward({}, /*retain_graph=*/true);
  }
  EXPECT_EQ(*step.watch.freed, 0);
  for (Step* each : {&plain, &step}) (each->first.sum() + each->second.sum()).backward();
  EXPECT_EQ(*step.watch.freed, 1);
  expect_same_gradients(plain, step);
}

TEST_F(LastBackwardTest, SeparateBackwardsKeepThemUntilTheLastOutput) {
  const auto x = torch::randn({4096}), s = torch::randn({4096});
  Step plain = run(x, s, false);
  Step step = run(x, s, true);
  for (Step* each : {&plain, &step}) each->first.sum().backward();
  EXPECT_EQ(*step.watch.freed, 0);
  for (Step* each : {&plain, &step}) each->second.sum().backward();
  EXPECT_EQ(*step.watch.freed, 1);
  expect_same_gradients(plain, step);
  // And where the other output is gone, the one backward is the last.
  Step alone = run(x, s, true);
  alone.second.reset();
  alone.first.sum().backward();
  EXPECT_EQ(*alone.watch.freed, 1);
}

// (A double backward needs retain_graph for plain autograd too; the region also keeps its
// arguments wherever a graph is made, without it.)
TEST_F(LastBackwardTest, ADoubleBackwardKeepsThem) {
  const auto x = torch::randn({4096}), s = torch::randn({4096});
  Step step = run(x, s, true);
  const auto grads = torch::autograd::grad({step.first.sum()}, {step.x}, {}, /*retain_graph=*/true,
                                           /*create_graph=*/true);
  EXPECT_EQ(*step.watch.freed, 0);
  grads[0].sum().backward();
  Step plain = run(x, s, false);
  const auto plain_grads = torch::autograd::grad({plain.first.sum()}, {plain.x}, {}, true, true);
  plain_grads[0].sum().backward();
  EXPECT_TRUE(bit_equal(plain_grads[0], grads[0]));
  expect_same_gradients(plain, step);
}

}  // namespace last_backward_test
