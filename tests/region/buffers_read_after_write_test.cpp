// A module that writes into a buffer in its forward and then reads it (a running normaliser,
// spectral norm's power iteration): the recompute must read what the forward read, the buffer's
// value before the write, not the value the forward left. It read the latter: gradients off by
// up to 2% of their norm, with no error (a hostile probe of PlannedModel found it in the region).

#include <ckpt/ckpt.h>
#include <ckpt/selective.h>

#include "support/stateful_blocks.h"
#include "support/support.h"

#include <string>
#include <vector>

namespace buffers_read_after_write_test {

using ckpt::test::bit_equal;
using ckpt::test::take_grads;

// Normalises by a running mean and scale that it updates first, in training: `updates` of them
// (0: neither, 1: the mean, 2: both).
struct RunningNormImpl : torch::nn::Module {
  RunningNormImpl() : fc(register_module("fc", torch::nn::Linear(16, 16))) {
    running_mean = register_buffer("running_mean", torch::zeros({16}));
    running_scale = register_buffer("running_scale", torch::ones({16}));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h = fc(x);
    if (is_training()) {
      const torch::NoGradGuard no_grad;
      if (updates >= 1) running_mean.mul_(0.5).add_(h.mean(0) * 0.5);
      if (updates >= 2) running_scale.mul_(0.5).add_(h.std(0) * 0.5);
    }
    return torch::tanh((h - running_mean) / running_scale);
  }
  torch::nn::Linear fc;
  torch::Tensor running_mean, running_scale;
  int updates = 2;
};
TORCH_MODULE(RunningNorm);

struct After {
  std::vector<torch::Tensor> tensors;  // input gradients, parameter gradients, buffers
  std::vector<std::string> warnings;
};

// A step for each of `updates` (what the module updates in it); with `options`, the module runs
// through ckpt::checkpoint (an argument of it: one call site).
After train(const ckpt::CheckpointOptions* options, const std::vector<int>& updates) {
  torch::manual_seed(0);
  RunningNorm norm;
  After after;
  ckpt::test::WarningCapture warnings;
  for (int update : updates) {
    norm->updates = update;
    auto x = torch::randn({8, 16}, torch::requires_grad());
    auto y = options != nullptr ? ckpt::checkpoint(*options, norm, x) : norm(x);
    y.pow(2).sum().backward();
    after.tensors.push_back(x.grad());
  }
  for (auto& g : take_grads(*norm)) after.tensors.push_back(g);
  for (const auto& b : norm->buffers()) after.tensors.push_back(b.clone());
  after.warnings = warnings.messages;
  return after;
}

void expect_same(const After& actual, const After& expected) {
  ASSERT_EQ(actual.tensors.size(), expected.tensors.size());
  for (size_t i = 0; i < actual.tensors.size(); ++i) {
    EXPECT_TRUE(bit_equal(actual.tensors[i], expected.tensors[i])) << "tensor #" << i;
  }
}

TEST(BuffersReadAfterWriteTest, EveryVariantRecomputesFromTheValueBeforeTheWrite) {
  const After plain = train(nullptr, {2, 2, 2});
  const std::vector<std::pair<std::string, ckpt::CheckpointOptions>> variants{
      {"default", ckpt::CheckpointOptions()},
      {"reentrant", ckpt::CheckpointOptions().use_reentrant(true)},
      {"selective", ckpt::CheckpointOptions().policy(ckpt::save_ops({"aten::tanh"}))},
      {"early stop", ckpt::CheckpointOptions().early_stop(true)}};
  for (const auto& [name, options] : variants) {
    SCOPED_TRACE(name);
    const After checkpointed = train(&options, {2, 2, 2});
    expect_same(checkpointed, plain);
    EXPECT_TRUE(checkpointed.warnings.empty());
  }
}

// Found by a hostile probe: a write through `.data()` moves no version counter and went unseen
// (the recompute read the counter as the forward left it), and a buffer that grows in the
// forward aborted the process when a destructor put it back. The module is an argument of the
// region; each variant runs three steps against the plain module's.
// Three steps of `module` (a fresh one from seed 1), through ckpt::checkpoint with `options`:
// the input's gradients, the parameters' and the buffers.
template <class Module>
std::vector<torch::Tensor> three_steps(const ckpt::CheckpointOptions* options) {
  torch::manual_seed(1);
  Module module;
  std::vector<torch::Tensor> after;
  for (int step = 0; step < 3; ++step) {
    auto x = torch::randn({16, 8}, torch::requires_grad());
    auto y = options != nullptr ? ckpt::checkpoint(*options, module, x) : module(x);
    y.pow(2).sum().backward();
    after.push_back(x.grad());
  }
  for (auto& g : take_grads(*module)) after.push_back(g);
  for (const auto& b : module->buffers()) after.push_back(b.clone());
  return after;
}

TEST(BuffersReadAfterWriteTest, UnversionedWritesAndGrowingBuffersRecomputeExactly) {
  const auto expect_exact = [](const auto& run) {
    const std::vector<torch::Tensor> plain = run(nullptr);
    for (const auto& options :
         {ckpt::CheckpointOptions(), ckpt::CheckpointOptions().use_reentrant(true)}) {
      SCOPED_TRACE(options.use_reentrant() ? "reentrant" : "default");
      const std::vector<torch::Tensor> checkpointed = run(&options);
      ASSERT_EQ(checkpointed.size(), plain.size());
      for (size_t i = 0; i < plain.size(); ++i) {
        EXPECT_TRUE(bit_equal(checkpointed[i], plain[i])) << "tensor #" << i;
      }
    }
  };
  expect_exact(three_steps<ckpt::test::DataCounter>);
  expect_exact(three_steps<ckpt::test::GrowingHistory>);
}

// A call site copies every buffer until a forward there writes one, then those written. A later
// forward that writes another keeps that call's graph (the buffer's value before is gone), with a
// warning, and the calls after it copy that buffer too.
TEST(BuffersReadAfterWriteTest, AWriteNoEarlierCallMadeKeepsThatCallsGraph) {
  const std::vector<int> updates{0, 1, 2, 2};
  const After plain = train(nullptr, updates);
  const ckpt::CheckpointOptions options;
  const After checkpointed = train(&options, updates);
  expect_same(checkpointed, plain);
  ASSERT_EQ(checkpointed.warnings.size(), 1u);
  EXPECT_NE(checkpointed.warnings[0].find("keeps its activations"), std::string::npos);
}

// Nested: the outer region's recompute runs the inner region's forward again, which must find
// the buffer as the outer forward found it, and so must the inner recompute.
TEST(BuffersReadAfterWriteTest, ANestedRegionRecomputesFromTheValueBeforeTheWrite) {
  const auto run = [](bool checkpointed) {
    torch::manual_seed(0);
    RunningNorm inner, outer;
    After after;
    for (int step = 0; step < 3; ++step) {
      auto x = torch::randn({8, 16}, torch::requires_grad());
      const auto block = [&](const torch::Tensor& t) {
        const torch::Tensor h = checkpointed ? ckpt::checkpoint(inner, t) : inner(t);
        return outer(h);
      };
      const torch::Tensor y = checkpointed
                                  ? ckpt::checkpoint([&](const torch::Tensor& t, RunningNorm,
                                                         RunningNorm) { return block(t); },
                                                     x, inner, outer)
                                  : block(x);
      y.pow(2).sum().backward();
      after.tensors.push_back(x.grad());
    }
    for (auto* m : {inner.get(), outer.get()}) {
      for (auto& g : take_grads(*m)) after.tensors.push_back(g);
      for (const auto& b : m->buffers()) after.tensors.push_back(b.clone());
    }
    return after;
  };
  expect_same(run(true), run(false));
}

}  // namespace buffers_read_after_write_test
