// Issue 29, item 6, and issue 45, item 3: a module ckpt cannot see (a TorchScript module, or a
// C++ module a lambda captures) updated its BatchNorm statistics in the forward and again in every
// recompute. Every recompute now puts back what it wrote outside the region's arguments and
// modules, so the statistics move once per step as without checkpointing, whichever module the
// call site ran (the first fix learned that state per call site, from its first forward: a loop
// of lambdas over several blocks restored the first block's statistics only).

#include <ckpt/ckpt.h>
#include <ckpt/selective.h>

#include "support/support.h"

#include <torch/csrc/jit/api/module.h>

#include <string>
#include <vector>

namespace outside_state_test {

using ckpt::test::bit_equal;

// BatchNorm written in TorchScript, as torch::jit::load would give it.
torch::jit::Module scripted_batch_norm(int64_t features) {
  torch::jit::Module module("ScriptedBatchNorm");
  module.register_parameter("weight", torch::rand({features}).requires_grad_(), false);
  module.register_parameter("bias", torch::rand({features}).requires_grad_(), false);
  module.register_buffer("running_mean", torch::zeros({features}));
  module.register_buffer("running_var", torch::ones({features}));
  module.register_buffer("num_batches_tracked", torch::zeros({}, torch::kLong));
  module.register_attribute("training", c10::BoolType::get(), true);
  module.define(R"(
def forward(self, x):
    if self.training:
        self.num_batches_tracked += 1
    return torch.batch_norm(x, self.weight, self.bias, self.running_mean, self.running_var,
                            self.training, 0.1, 1e-5, False)
)");
  return module;
}

// Everything a step leaves behind: the input gradients, every parameter gradient, every buffer.
struct After {
  std::vector<torch::Tensor> tensors;
  std::vector<std::string> warnings;
};

void expect_same(const After& actual, const After& expected) {
  ASSERT_EQ(actual.tensors.size(), expected.tensors.size());
  for (size_t i = 0; i < actual.tensors.size(); ++i) {
    EXPECT_TRUE(bit_equal(actual.tensors[i], expected.tensors[i])) << "tensor #" << i;
  }
}

// Four training steps of linear -> scripted BatchNorm -> tanh, the scripted module captured by
// the lambda; checkpointed with `options` or plain. `Site` gives each test its own call site.
template <int Site>
After train_scripted(const c10::optional<ckpt::CheckpointOptions>& options) {
  torch::manual_seed(0);
  torch::nn::Linear linear(8, 8);
  torch::jit::Module batch_norm = scripted_batch_norm(8);
  auto block = [&](const torch::Tensor& x) {
    return torch::tanh(batch_norm.forward({linear(x)}).toTensor());
  };
  After after;
  ckpt::test::WarningCapture warnings;
  for (int step = 0; step < 4; ++step) {
    auto x = torch::randn({6, 8}, torch::requires_grad());
    auto y = options ? ckpt::checkpoint(*options, block, x) : block(x);
    y.pow(2).sum().backward();
    after.tensors.push_back(x.grad());
  }
  for (const auto& p : linear->parameters()) after.tensors.push_back(p.grad());
  for (const auto& p : batch_norm.parameters()) after.tensors.push_back(p.grad());
  for (const auto& b : batch_norm.buffers()) after.tensors.push_back(b);
  after.warnings = warnings.messages;
  return after;
}

TEST(OutsideStateTest, ATorchScriptBatchNormMovesItsStatisticsOncePerStep) {
  const After plain = train_scripted<0>(c10::nullopt);
  EXPECT_EQ(plain.tensors.back().item<int64_t>(), 4);  // num_batches_tracked
  const After checkpointed = train_scripted<1>(ckpt::CheckpointOptions());
  expect_same(checkpointed, plain);
  EXPECT_TRUE(checkpointed.warnings.empty()) << ::testing::PrintToString(checkpointed.warnings);
}

TEST(OutsideStateTest, EveryVariantPutsTheStateBack) {
  const After plain = train_scripted<0>(c10::nullopt);
  expect_same(train_scripted<2>(ckpt::CheckpointOptions().use_reentrant(true)), plain);
  expect_same(train_scripted<3>(ckpt::CheckpointOptions().policy(ckpt::save_matmuls())), plain);
  // debug(true) compares the recompute's operators with the forward's: the copies the region
  // makes to put the state back are not among them.
  expect_same(train_scripted<4>(ckpt::CheckpointOptions().debug(true)), plain);
}

// A C++ BatchNorm the lambda captures, not passed as an argument: the same.
template <int Site>
After train_captured(bool checkpointed) {
  torch::manual_seed(0);
  torch::nn::Linear linear(8, 8);
  torch::nn::BatchNorm1d batch_norm(8);
  auto block = [&](const torch::Tensor& x) { return torch::tanh(batch_norm(linear(x))); };
  After after;
  ckpt::test::WarningCapture warnings;
  for (int step = 0; step < 3; ++step) {
    auto x = torch::randn({6, 8}, torch::requires_grad());
    auto y = checkpointed ? ckpt::checkpoint(block, x) : block(x);
    y.pow(2).sum().backward();
    after.tensors.push_back(x.grad());
  }
  for (const auto& p : linear->parameters()) after.tensors.push_back(p.grad());
  for (const auto& p : batch_norm->parameters()) after.tensors.push_back(p.grad());
  for (const auto& b : batch_norm->buffers()) after.tensors.push_back(b);
  after.warnings = warnings.messages;
  return after;
}

TEST(OutsideStateTest, ACapturedModuleMovesItsStatisticsOncePerStep) {
  const After checkpointed = train_captured<1>(true);
  expect_same(checkpointed, train_captured<0>(false));
  EXPECT_TRUE(checkpointed.warnings.empty()) << ::testing::PrintToString(checkpointed.warnings);
}

// A module passed as an argument is restored by the region itself.
TEST(OutsideStateTest, AModuleArgumentNeedsNoWatching) {
  torch::nn::Linear linear(8, 8);
  torch::nn::BatchNorm1d batch_norm(8);
  ckpt::test::WarningCapture warnings;
  for (int step = 0; step < 2; ++step) {
    auto x = torch::randn({6, 8}, torch::requires_grad());
    auto y = ckpt::checkpoint(
        [&](const torch::Tensor& t, torch::nn::BatchNorm1d bn) { return bn(linear(t)); }, x,
        batch_norm);
    y.pow(2).sum().backward();
  }
  EXPECT_EQ(batch_norm->num_batches_tracked.item<int64_t>(), 2);
  EXPECT_TRUE(warnings.messages.empty()) << ::testing::PrintToString(warnings.messages);
}

// A TorchScript module passed as an argument is no torch::nn::Module either: watched the same way.
TEST(OutsideStateTest, ATorchScriptModuleArgumentIsWatchedToo) {
  torch::manual_seed(0);
  torch::jit::Module batch_norm = scripted_batch_norm(8);
  torch::jit::Module reference = batch_norm.deepcopy();
  auto block = [](const torch::Tensor& x, torch::jit::Module module) {
    return torch::tanh(module.forward({x}).toTensor());
  };
  for (int step = 0; step < 3; ++step) {
    auto x = torch::randn({6, 8}, torch::requires_grad());
    auto plain_x = x.detach().requires_grad_();
    ckpt::checkpoint(block, x, batch_norm).pow(2).sum().backward();
    block(plain_x, reference).pow(2).sum().backward();
    EXPECT_TRUE(bit_equal(x.grad(), plain_x.grad()));
  }
  std::vector<torch::Tensor> actual_list, expected_list;
  for (const auto& b : batch_norm.buffers()) actual_list.push_back(b);
  for (const auto& b : reference.buffers()) expected_list.push_back(b);
  ASSERT_EQ(actual_list.size(), 3u);
  for (size_t i = 0; i < actual_list.size(); ++i) {
    EXPECT_TRUE(bit_equal(actual_list[i], expected_list[i])) << "buffer " << i;
  }
  EXPECT_EQ(actual_list[2].item<int64_t>(), 3);
}

// The most common loop (issue 45, item 3): one lambda per block, each capturing its block, all
// made at one call site. Every block's statistics move once per step, as in the plain loop.
struct Block : torch::nn::Module {
  Block()
      : linear(register_module("linear", torch::nn::Linear(8, 8))),
        norm(register_module("norm", torch::nn::BatchNorm1d(8))) {}
  torch::Tensor forward(const torch::Tensor& x) { return torch::tanh(norm(linear(x))); }
  torch::nn::Linear linear;
  torch::nn::BatchNorm1d norm;
};

std::vector<torch::Tensor> train_blocks(bool checkpointed) {
  torch::manual_seed(0);
  std::vector<std::shared_ptr<Block>> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(std::make_shared<Block>());
  std::vector<torch::Tensor> after;
  for (int step = 0; step < 2; ++step) {
    auto x = torch::randn({6, 8}, torch::requires_grad());
    torch::Tensor h = x;
    for (auto& blk : blocks) {
      auto fn = [blk](const torch::Tensor& t) { return blk->forward(t); };
      h = checkpointed ? ckpt::checkpoint(fn, h) : fn(h);
    }
    h.pow(2).sum().backward();
    after.push_back(x.grad());
  }
  for (const auto& blk : blocks) {
    for (const auto& p : blk->parameters()) after.push_back(p.grad());
    for (const auto& b : blk->buffers()) after.push_back(b);
  }
  return after;
}

TEST(OutsideStateTest, ALoopOfLambdasMovesEveryBlocksStatisticsOncePerStep) {
  const std::vector<torch::Tensor> plain = train_blocks(false);
  const std::vector<torch::Tensor> checkpointed = train_blocks(true);
  ASSERT_EQ(checkpointed.size(), plain.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_TRUE(bit_equal(checkpointed[i], plain[i])) << "tensor #" << i;
  }
  EXPECT_EQ(checkpointed.back().item<int64_t>(), 2);  // the last block's num_batches_tracked
}

// One lambda that captures two BatchNorm modules (issue 46, item 4): both move once per step.
TEST(OutsideStateTest, ALambdaCapturingTwoModulesMovesBothOnce) {
  torch::nn::BatchNorm1d first(8), second(8);
  auto fn = [&](const torch::Tensor& t) { return second(torch::tanh(first(t))); };
  for (int step = 0; step < 3; ++step) {
    auto x = torch::randn({6, 8}, torch::requires_grad());
    ckpt::checkpoint(fn, x).pow(2).sum().backward();
  }
  EXPECT_EQ(first->num_batches_tracked.item<int64_t>(), 3);
  EXPECT_EQ(second->num_batches_tracked.item<int64_t>(), 3);
}

}  // namespace outside_state_test
