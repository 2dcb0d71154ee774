// Issue 33, items 2 and 7: backward passes in one GraphExecGroup share one recompute per region.

#include <ckpt/ckpt.h>

#include "support/support.h"

#include <memory>
#include <optional>
#include <thread>
#include <vector>

namespace graph_exec_group_test {

using ckpt::test::bit_equal;
using ckpt::test::take_grads;

struct Block : torch::nn::Module {
  Block()
      : first(register_module("first", torch::nn::Linear(5, 8))),
        second(register_module("second", torch::nn::Linear(8, 5))) {}
  at::Tensor forward(const at::Tensor& x) {
    if (ckpt::is_recomputing()) ++recomputes;
    return second(first(x).tanh()).sin();
  }
  torch::nn::Linear first, second;
  int recomputes = 0;
};

struct Result {
  at::Tensor input_grad;
  std::vector<at::Tensor> grads;
};

void expect_same(const Result& a, const Result& b) {
  EXPECT_TRUE(bit_equal(a.input_grad, b.input_grad));
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t i = 0; i < a.grads.size(); ++i) EXPECT_TRUE(bit_equal(a.grads[i], b.grads[i])) << i;
}

struct GraphExecGroupTest : ckpt::test::SeedingFixture {
  std::shared_ptr<Block> block = std::make_shared<Block>();
  at::Tensor input = torch::randn({4, 5});

  at::Tensor forward(const at::Tensor& x, bool checkpointed) {
    return checkpointed ? ckpt::checkpoint(block, x) : block->forward(x);
  }

  // A gradient penalty: the input gradient with create_graph, then one backward of the loss
  // and the penalty together.
  Result penalised_step(bool checkpointed, bool grouped) {
    block->recomputes = 0;
    std::optional<ckpt::GraphExecGroup> group;
    if (grouped) group.emplace();
    const at::Tensor x = input.detach().requires_grad_();
    const at::Tensor loss = forward(x, checkpointed).pow(2).sum();
    const at::Tensor gradient = torch::autograd::grad({loss}, {x}, {}, true, true)[0];
    (loss + gradient.pow(2).sum()).backward();
    return {x.grad().clone(), take_grads(*block)};
  }
};

// Without a group the second pass recomputes, and its parameter gradients are the loss's and
// the penalty's computed apart and then summed, which rounds differently from plain autograd's
// sum at each node. In a group the second pass runs through the first one's recomputed graph,
// as plain autograd runs through the forward's: one recompute, and plain autograd's bits.
TEST_F(GraphExecGroupTest, AGradientPenaltyRecomputesOnceInAGroup) {
  const Result plain = penalised_step(false, false);
  const Result ungrouped = penalised_step(true, false);
  EXPECT_EQ(block->recomputes, 2);
  EXPECT_TRUE(ckpt::test::close(ungrouped.input_grad, plain.input_grad));
  for (size_t i = 0; i < plain.grads.size(); ++i)
    EXPECT_TRUE(ckpt::test::close(ungrouped.grads[i], plain.grads[i])) << i;
  const Result grouped = penalised_step(true, true);
  EXPECT_EQ(block->recomputes, 1);
  expect_same(grouped, plain);
}

// Several losses through one graph (retain_graph), with the forward outside the group: the
// backward passes on the group's thread share one recompute.
TEST_F(GraphExecGroupTest, SeveralLossesShareOneRecompute) {
  auto step = [&](bool checkpointed, bool grouped) {
    block->recomputes = 0;
    const at::Tensor x = input.detach().requires_grad_();
    const at::Tensor out = forward(x, checkpointed);
    std::optional<ckpt::GraphExecGroup> group;
    if (grouped) group.emplace();
    for (int i = 0; i < 3; ++i) out.pow(i + 1).sum().backward({}, /*retain_graph=*/i < 2);
    return Result{x.grad().clone(), take_grads(*block)};
  };
  const Result plain = step(false, false);
  expect_same(step(true, false), plain);
  EXPECT_EQ(block->recomputes, 3);
  expect_same(step(true, true), plain);
  EXPECT_EQ(block->recomputes, 1);
}

// A tensor the region captures, written between two backward passes: without a group the second
// pass recomputes and would read its new values (an error); in a group it runs through the first
// pass's recomputed graph, which reads nothing again, so the write is no error and the gradients
// are the plain ones (plain autograd saved nothing of it either).
TEST_F(GraphExecGroupTest, ACapturedTensorWrittenBetweenBackwardsOfAGroupReadsNothingAgain) {
  const at::Tensor shift = torch::ones({5});
  const auto fn = [&](const at::Tensor& t) { return block->forward(t + shift); };
  auto step = [&](bool checkpointed) {
    shift.fill_(1);
    const at::Tensor x = input.detach().requires_grad_();
    const at::Tensor out = checkpointed ? ckpt::checkpoint(fn, x) : fn(x);
    const ckpt::GraphExecGroup group;
    out.sum().backward({}, /*retain_graph=*/true);
    shift.fill_(2);
    out.pow(2).sum().backward();
    return Result{x.grad().clone(), take_grads(*block)};
  };
  const Result plain = step(false);
  expect_same(step(true), plain);
  // Without the group: the second pass's recompute would read the new values.
  const at::Tensor x = input.detach().requires_grad_();
  shift.fill_(1);
  const at::Tensor out = ckpt::checkpoint(fn, x);
  out.sum().backward({}, /*retain_graph=*/true);
  shift.fill_(2);
  CKPT_EXPECT_THROWS_WITH(out.pow(2).sum().backward(), "that the region's function read");
  take_grads(*block);
}

// A group that ends while a backward runs (here, from a hook inside it): that backward finishes
// on the graph it holds, a later one recomputes, and the gradients are the plain ones.
TEST_F(GraphExecGroupTest, EndingDuringABackwardFinishesIt) {
  auto step = [&](bool checkpointed, bool grouped) {
    block->recomputes = 0;
    std::optional<ckpt::GraphExecGroup> group;
    if (grouped) group.emplace();
    const at::Tensor x = input.detach().requires_grad_();
    const at::Tensor out = forward(x, checkpointed);
    out.sum().backward({}, /*retain_graph=*/true);
    if (group)
      x.register_hook([&](const at::Tensor& grad) {
        group->end();
        return grad;
      });
    out.pow(2).sum().backward({}, /*retain_graph=*/true);
    out.pow(3).sum().backward();
    return Result{x.grad().clone(), take_grads(*block)};
  };
  const Result plain = step(false, false);
  expect_same(step(true, true), plain);
  EXPECT_EQ(block->recomputes, 2);
}

// Issue 45, item 6: nested regions in a group, one backward and a gradient penalty (it crashed:
// SIGSEGV, or "corrupted size vs. prev_size": the outer region's capture put back edges of the
// inner region's node after that node had redirected them into its recomputed graph).
TEST_F(GraphExecGroupTest, NestedRegionsInAGroup) {
  auto inner = [&](const at::Tensor& t) { return block->forward(t); };
  auto outer = [&](const at::Tensor& t) { return ckpt::checkpoint(inner, t.cos()).exp(); };
  for (const bool penalty : {false, true}) {
    SCOPED_TRACE(penalty);
    auto step = [&](bool checkpointed) {
      std::optional<ckpt::GraphExecGroup> group;
      if (checkpointed) group.emplace();
      const at::Tensor x = input.detach().requires_grad_();
      const at::Tensor y =
          checkpointed ? ckpt::checkpoint(outer, x) : block->forward(x.cos()).exp();
      at::Tensor loss = y.pow(2).sum();
      if (penalty) loss = loss + torch::autograd::grad({loss}, {x}, {}, true, true)[0].pow(2).sum();
      loss.backward();
      return Result{x.grad().clone(), take_grads(*block)};
    };
    const Result plain = step(false);
    const Result grouped = step(true);
    if (!penalty) {
      expect_same(grouped, plain);
      continue;
    }
    // The penalty's second pass through the inner region sums apart, as without a group (to the
    // bit only one level deep: docs/limits.md).
    EXPECT_TRUE(ckpt::test::close(grouped.input_grad, plain.input_grad));
    for (size_t i = 0; i < plain.grads.size(); ++i)
      EXPECT_TRUE(ckpt::test::close(grouped.grads[i], plain.grads[i])) << i;
  }
}

// A hostile probe: nested regions in a group, one backward that keeps the graph and one that
// does not. The second hung: the inner region's node, let go of inside the outer region's
// backward, took a pointer to itself that released it again, inside its own lock.
TEST_F(GraphExecGroupTest, NestedRegionsInAGroupServeABackwardThatKeepsTheGraphAndOneThatDoesNot) {
  auto inner = [&](const at::Tensor& t) { return block->forward(t); };
  auto outer = [&](const at::Tensor& t) { return ckpt::checkpoint(inner, t.cos()).exp(); };
  auto step = [&](bool checkpointed) {
    std::optional<ckpt::GraphExecGroup> group;
    if (checkpointed) group.emplace();
    const at::Tensor x = input.detach().requires_grad_();
    const at::Tensor y = checkpointed ? ckpt::checkpoint(outer, x) : block->forward(x.cos()).exp();
    y.pow(2).sum().backward({}, /*retain_graph=*/true);
    y.pow(2).sum().backward();
    return Result{x.grad().clone(), take_grads(*block)};
  };
  const Result plain = step(false);
  expect_same(step(true), plain);
}

TEST(GraphExecGroup, GroupsDoNotNest) {
  ckpt::GraphExecGroup group;
  CKPT_EXPECT_THROWS_WITH(ckpt::GraphExecGroup inner, "cannot be nested");
  group.end();
  group.end();  // ending twice is harmless
}

// Issue 45, item 14: a group that ended is current no more, so a new one may follow it (it was
// refused with "end it first"), also when another thread ended it.
TEST(GraphExecGroup, ANewGroupMayFollowOneThatEnded) {
  ckpt::GraphExecGroup first;
  first.end();
  ckpt::GraphExecGroup second;
  std::thread([&] { second.end(); }).join();
  ckpt::GraphExecGroup third;
  CKPT_EXPECT_THROWS_WITH(ckpt::GraphExecGroup inner, "cannot be nested");
}

}  // namespace graph_exec_group_test
