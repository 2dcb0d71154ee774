// ckpt::checkpoint, non-reentrant (the default): gradients, autograd::grad, captured tensors,
// repeated backward, concurrency, compared against the same computation without checkpointing.

#include <ckpt/checkpoint.h>
#include <ckpt/graph_exec_group.h>
#include <ckpt/memory_tracker.h>

#include "support/support.h"

#include <atomic>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace checkpoint_test {

using ckpt::test::bit_equal;
using ckpt::test::take_grads;

struct CheckpointTest : ckpt::test::SeedingFixture {};

torch::nn::Sequential make_block(int64_t width = 16) {
  return torch::nn::Sequential(torch::nn::Linear(width, 2 * width), torch::nn::Tanh(),
                               torch::nn::Linear(2 * width, width), torch::nn::Sigmoid());
}

TEST_F(CheckpointTest, GradientsMatchUncheckpointedRunBitForBit) {
  auto block = make_block();
  auto x = torch::randn({8, 16}, torch::requires_grad());

  auto expected = block->forward(x);
  expected.pow(2).sum().backward();
  auto expected_x = x.grad().clone();
  auto expected_params = take_grads(*block);
  x.mutable_grad() = torch::Tensor();

  auto actual = ckpt::checkpoint([&](const torch::Tensor& t) { return block->forward(t); }, x);
  EXPECT_TRUE(bit_equal(actual, expected));
  actual.pow(2).sum().backward();
  EXPECT_TRUE(bit_equal(x.grad(), expected_x));
  auto actual_params = take_grads(*block);
  ASSERT_EQ(actual_params.size(), expected_params.size());
  for (size_t i = 0; i < actual_params.size(); ++i) {
    EXPECT_TRUE(bit_equal(actual_params[i], expected_params[i])) << "parameter " << i;
  }
}

TEST_F(CheckpointTest, ForwardKeepsOnlyTheBoundaryOfTheRegion) {
  auto block = make_block();
  auto x = torch::randn({4, 16}, torch::requires_grad());
  auto y = ckpt::checkpoint(block, x);
  ASSERT_TRUE(y.grad_fn());
  EXPECT_EQ(y.grad_fn()->name(), "ckpt::CheckpointBackward");
  // Next edges: the input's accumulator and the four parameters' accumulators, nothing inside.
  EXPECT_EQ(y.grad_fn()->num_outputs(), 5u);
  for (const auto& edge : y.grad_fn()->next_edges()) {
    EXPECT_NE(dynamic_cast<torch::autograd::AccumulateGrad*>(edge.function.get()), nullptr);
  }
}

// The region's backward holds what its recomputed graph saved, not the recomputed outputs: a
// step peaks no higher than the plain one where the recompute needs no more than the forward.
TEST_F(CheckpointTest, TheBackwardDoesNotHoldTheRecomputedOutputs) {
  const auto w = torch::randn({256, 256}, torch::requires_grad());
  const auto x = torch::randn({256, 256}, torch::requires_grad());
  auto fn = [&](const torch::Tensor& t) { return t.mm(w) * 2; };  // its output, saved by nothing
  ckpt::MemoryTracker tracker;
  auto step_peak = [&](bool checkpointed) {
    const int64_t before = tracker.current_bytes();
    tracker.reset_peak();
    const auto loss = (checkpointed ? ckpt::checkpoint(fn, x) : fn(x)).sum();
    torch::autograd::grad({loss}, {x, w});
    return tracker.peak_bytes() - before;
  };
  const int64_t plain = step_peak(false);
  EXPECT_EQ(step_peak(true), plain);
}

// Nor its output's gradient past the recomputed node that reads it: autograd's backward (and
// Python's non-reentrant checkpoint, which recomputes inside it) lets it go there. The region's
// backward held it to its end, one output-sized tensor above them (issue 48).
TEST_F(CheckpointTest, TheBackwardLetsGoOfTheOutputsGradientOnceRead) {
  torch::nn::Linear linear(16, 32);
  const auto x = torch::randn({8, 16}, torch::requires_grad());
  c10::Storage grad_memory;
  long holders = -1;
  const auto y = ckpt::checkpoint(
      [&](const torch::Tensor& t) {
        torch::Tensor h = linear(t);
        // Reached in the recompute's backward once tanh's backward has read the output's gradient.
        h.register_hook([&](const torch::Tensor&) {
          if (holders < 0) holders = static_cast<long>(grad_memory.use_count());
        });
        return torch::tanh(h);
      },
      x);
  y.register_hook([&](const torch::Tensor& grad) { grad_memory = grad.storage(); });
  (y * 2).sum().backward();
  EXPECT_EQ(holders, 1) << "only this test holds the gradient of the region's output";
}

TEST_F(CheckpointTest, WorksWithAutogradGradForInputsAndParameters) {
  auto block = make_block();
  auto x = torch::randn({8, 16}, torch::requires_grad());
  auto w = block->parameters()[0];

  auto expected = torch::autograd::grad({block->forward(x).sum()}, {x, w});
  auto actual = torch::autograd::grad({ckpt::checkpoint(block, x).sum()}, {x, w});
  EXPECT_TRUE(bit_equal(actual[0], expected[0]));
  EXPECT_TRUE(bit_equal(actual[1], expected[1]));
  // grad() does not touch .grad of anything.
  EXPECT_FALSE(x.grad().defined());
  EXPECT_FALSE(w.grad().defined());
}

TEST_F(CheckpointTest, BackwardWithInputsArgumentComputesOnlyThose) {
  auto block = make_block();
  auto x = torch::randn({8, 16}, torch::requires_grad());
  auto expected = torch::autograd::grad({block->forward(x).sum()}, {x})[0];
  torch::autograd::backward({ckpt::checkpoint(block, x).sum()}, {}, c10::nullopt, false, {x});
  EXPECT_TRUE(bit_equal(x.grad(), expected));
  for (const auto& p : block->parameters()) EXPECT_FALSE(p.grad().defined());
}

TEST_F(CheckpointTest, InputWithoutGradStillGivesParameterGradients) {
  auto block = make_block();
  auto x = torch::randn({8, 16});
  block->forward(x).sum().backward();
  auto expected = take_grads(*block);
  auto y = ckpt::checkpoint(block, x);
  EXPECT_TRUE(y.requires_grad());
  y.sum().backward();
  auto actual = take_grads(*block);
  for (size_t i = 0; i < actual.size(); ++i) EXPECT_TRUE(bit_equal(actual[i], expected[i]));
}

TEST_F(CheckpointTest, CapturedNonLeafTensorsReceiveGradients) {
  auto a = torch::randn({5, 5}, torch::requires_grad());
  auto w = torch::randn({5, 5}, torch::requires_grad());
  auto scale = w * 2;  // a non-leaf captured by the closure
  auto fn = [&](const torch::Tensor& t) { return (t.matmul(scale)).tanh() * scale.sum(); };

  auto expected = torch::autograd::grad({fn(a).sum()}, {a, w});
  auto actual = torch::autograd::grad({ckpt::checkpoint(fn, a).sum()}, {a, w});
  EXPECT_TRUE(bit_equal(actual[0], expected[0]));
  EXPECT_TRUE(bit_equal(actual[1], expected[1]));
}

// The region's input and a tensor it captures are linked before the region: the recompute must
// stop at the region's border instead of running (and freeing) the graph before it.
TEST_F(CheckpointTest, BoundaryTensorsThatDependOnEachOtherAreNotDifferentiatedTwice) {
  auto a = torch::randn({4, 4}, torch::requires_grad());
  int pre_region_hook_calls = 0;
  auto x = a.exp();
  x.register_hook([&](const torch::Tensor& g) {
    ++pre_region_hook_calls;
    return g;
  });
  auto captured = x.sin();  // depends on x, captured by the closure
  auto fn = [&](const torch::Tensor& t) { return (t * captured).cos(); };

  auto expected = torch::autograd::grad({fn(x).sum()}, {a}, {}, /*retain_graph=*/true)[0];
  pre_region_hook_calls = 0;
  auto y = ckpt::checkpoint(fn, x);
  y.sum().backward();
  EXPECT_TRUE(bit_equal(a.grad(), expected));
  EXPECT_EQ(pre_region_hook_calls, 1);
}

TEST_F(CheckpointTest, ParameterUsedInsideAndOutsideGetsOneAccumulatedGradient) {
  // Port of test_checkpointing_without_reentrant_parameter_used_in_an_out (test_autograd.py).
  auto w = torch::randn({10, 10}, torch::requires_grad());
  int hook_calls = 0;
  w.register_hook([&](const torch::Tensor& g) {
    ++hook_calls;
    return g;
  });
  auto x = torch::rand({10, 10}, torch::requires_grad());
  auto h = w * x;
  auto out = ckpt::checkpoint([&](const torch::Tensor& t) { return w * t; }, h);
  out = ckpt::checkpoint([&](const torch::Tensor& t) { return w * t; }, out);
  out.sum().backward();
  EXPECT_EQ(hook_calls, 1);
  EXPECT_TRUE(ckpt::test::close(w.grad(), 3 * w * w * x));
}

// Counts how often a gradient accumulator runs: a data-parallel reducer hooks in this way.
struct CountingPostHook : torch::autograd::FunctionPostHook {
  explicit CountingPostHook(int* calls) : calls(calls) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    ++*calls;
    return outputs;
  }
  int* calls;
};

TEST_F(CheckpointTest, AccumulatorOfAParameterInSeveralRegionsRunsOncePerBackward) {
  torch::nn::Linear shared(8, 8);
  auto x = torch::randn({4, 8}, torch::requires_grad());
  auto block = [&](const torch::Tensor& t) { return shared(t).tanh(); };
  auto expected = torch::autograd::grad({block(block(x)).sum()}, {shared->weight})[0];
  int calls = 0;
  // Held, as a reducer holds it: a leaf keeps its accumulator only weakly.
  auto accumulator = torch::autograd::impl::grad_accumulator(shared->weight);
  accumulator->add_post_hook(std::make_unique<CountingPostHook>(&calls));
  // Two steps: the first creates the gradient buffer, the second accumulates into it in place.
  for (int step = 1; step <= 2; ++step) {
    calls = 0;
    ckpt::checkpoint(block, ckpt::checkpoint(block, x)).sum().backward();
    EXPECT_EQ(calls, 1) << "step " << step;
    EXPECT_TRUE(ckpt::test::close(shared->weight.grad(), expected * step)) << "step " << step;
  }
}

// Gradient accumulation: a second backward adds into existing gradients. Autograd sums a
// backward's inputs to an accumulator first and then adds the sum into `.grad`; where a region's
// gradient is not the accumulator's only input, adding it in on its own would round differently.
// Leaves used twice in one region, in two regions, and in a region and outside it.
TEST_F(CheckpointTest, GradientsAccumulatedOverTwoBackwardsAreThePlainOnesToTheBit) {
  torch::nn::Linear shared(8, 8);
  const auto input = torch::randn({4, 8});
  using Forward = std::function<at::Tensor(const at::Tensor&, bool)>;
  const std::vector<std::pair<std::string, Forward>> cases = {
      {"input used twice",
       [](const at::Tensor& x, bool checkpointed) {
         auto fn = [](const at::Tensor& t) { return t + t.sin(); };
         return checkpointed ? ckpt::checkpoint(fn, x) : fn(x);
       }},
      {"parameter used twice",
       [&](const at::Tensor& x, bool checkpointed) {
         auto fn = [&](const at::Tensor& t) { return shared(shared(t).tanh()); };
         return checkpointed ? ckpt::checkpoint(fn, x) : fn(x);
       }},
      {"parameter in two regions and outside", [&](const at::Tensor& x, bool checkpointed) {
         auto fn = [&](const at::Tensor& t) { return shared(t).tanh(); };
         const auto h = checkpointed ? ckpt::checkpoint(fn, ckpt::checkpoint(fn, x)) : fn(fn(x));
         return shared(h);
       }}};
  for (const auto& [name, forward] : cases) {
    SCOPED_TRACE(name);
    auto two_backwards = [&, &forward = forward](bool checkpointed) {
      auto x = input.detach().requires_grad_();
      for (int i = 0; i < 2; ++i) forward(x, checkpointed).square().sum().backward();
      auto grads = take_grads(*shared);
      grads.push_back(x.grad());
      return grads;
    };
    const auto plain = two_backwards(false);
    const auto checkpointed = two_backwards(true);
    for (size_t i = 0; i < plain.size(); ++i)
      EXPECT_TRUE(bit_equal(checkpointed[i], plain[i])) << i;
  }
}

TEST_F(CheckpointTest, PostAccumulateGradHookOfAParameterInTwoRegionsFiresOncePerBackward) {
  torch::nn::Linear shared(8, 8);
  auto x = torch::randn({4, 8}, torch::requires_grad());
  auto block = [&](const torch::Tensor& t) { return shared(t).tanh(); };
  auto expected = torch::autograd::grad({block(block(x)).sum()}, {shared->weight})[0];
  int calls = 0;
  at::Tensor seen;
  const bool supported =
      ckpt::test::set_post_accumulate_grad_hook(shared->weight, [&](const at::Tensor& leaf) {
        ++calls;
        seen = leaf.grad().clone();
      });
  if (!supported) GTEST_SKIP() << "this LibTorch has no post-accumulate-grad hooks (2.1+)";
  // The first step creates the gradient buffer; later ones would be added in place.
  for (int step = 1; step <= 3; ++step) {
    calls = 0;
    ckpt::checkpoint(block, ckpt::checkpoint(block, x)).sum().backward();
    EXPECT_EQ(calls, 1) << "step " << step;
    // The hook sees the whole step's gradient, both regions' contributions already summed in.
    EXPECT_TRUE(ckpt::test::close(seen, expected * step)) << "step " << step;
  }
}

TEST_F(CheckpointTest, RecomputesOncePerBackwardAndRetainGraphAllowsASecond) {
  int calls = 0;
  auto fn = [&](const torch::Tensor& t) {
    ++calls;
    return t.sin().exp();
  };
  auto x = torch::randn({6}, torch::requires_grad());
  auto y = ckpt::checkpoint(fn, x);
  EXPECT_EQ(calls, 1);
  y.sum().backward({}, /*retain_graph=*/true);
  EXPECT_EQ(calls, 2);
  auto first = x.grad().clone();
  y.sum().backward();
  EXPECT_EQ(calls, 3);
  EXPECT_TRUE(bit_equal(x.grad(), first * 2));
  CKPT_EXPECT_THROWS_WITH(y.sum().backward(), "second time");
}

TEST_F(CheckpointTest, UnderNoGradGuardItJustRunsTheFunction) {
  int calls = 0;
  auto x = torch::randn({3}, torch::requires_grad());
  torch::Tensor y;
  {
    torch::NoGradGuard no_grad;
    y = ckpt::checkpoint(
        [&](const torch::Tensor& t) {
          ++calls;
          return t * 2;
        },
        x);
  }
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(y.requires_grad());
  EXPECT_TRUE(bit_equal(y, x.detach() * 2));
}

TEST_F(CheckpointTest, FunctionWithoutDifferentiableOutputKeepsNothing) {
  auto x = torch::randn({3});  // nothing requires grad
  auto y = ckpt::checkpoint([](const torch::Tensor& t) { return t.exp(); }, x);
  EXPECT_FALSE(y.requires_grad());
  EXPECT_TRUE(bit_equal(y, x.exp()));
}

TEST_F(CheckpointTest, OutputThatIsAnInputGetsItsGradient) {
  auto x = torch::randn({4}, torch::requires_grad());
  auto [same, doubled] =
      ckpt::checkpoint([](const torch::Tensor& t) { return std::make_tuple(t, t * 2); }, x);
  (same * 3 + doubled).sum().backward();
  EXPECT_TRUE(bit_equal(x.grad(), torch::full({4}, 5.0)));
}

TEST_F(CheckpointTest, ModuleHolderCanBeCheckpointedDirectly) {
  torch::nn::Linear linear(4, 3);
  auto x = torch::randn({2, 4}, torch::requires_grad());
  auto expected = torch::autograd::grad({linear(x).sum()}, {x})[0];
  auto actual = torch::autograd::grad({ckpt::checkpoint(linear, x).sum()}, {x})[0];
  EXPECT_TRUE(bit_equal(actual, expected));
}

TEST_F(CheckpointTest, ThreadsRunRegionsConcurrently) {
  constexpr int kThreads = 4;
  std::vector<torch::nn::Sequential> blocks;
  std::vector<torch::Tensor> inputs, expected;
  for (int i = 0; i < kThreads; ++i) {
    blocks.push_back(make_block(12));
    inputs.push_back(torch::randn({5, 12}, torch::requires_grad()));
    auto y = blocks[i]->forward(blocks[i]->forward(inputs[i]));
    expected.push_back(torch::autograd::grad({y.sum()}, {inputs[i]})[0]);
  }
  std::vector<torch::Tensor> actual(kThreads);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      try {
        for (int repeat = 0; repeat < 20; ++repeat) {
          auto h = ckpt::checkpoint(blocks[i], inputs[i]);
          auto y = ckpt::checkpoint(blocks[i], h);
          actual[i] = torch::autograd::grad({y.sum()}, {inputs[i]})[0];
          if (!torch::equal(actual[i], expected[i])) ++failures;
        }
      } catch (...) {
        ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
}

// Issue 46, frictions: a gradient penalty (torch::autograd::grad with create_graph) through a
// region raised LibTorch's "backward() with create_graph=True" warning, meant for a user's own
// backward, from the region's recompute; in a GraphExecGroup the gradients are the plain ones' bits
// (docs/mechanism.md: without one they round differently).
TEST_F(CheckpointTest, AGradientPenaltyRaisesNoWarningMeantForBackward) {
  torch::nn::Linear lin(8, 8);
  const torch::Tensor x0 = torch::randn({4, 8});
  auto step = [&](bool checkpointed) {
    auto x = x0.detach().requires_grad_();
    const ckpt::GraphExecGroup group;
    auto fn = [&](const torch::Tensor& t) { return torch::tanh(lin(t)); };
    const torch::Tensor y = checkpointed ? ckpt::checkpoint(fn, x) : fn(x);
    const auto grads = torch::autograd::grad({y.pow(2).sum()}, {x}, {}, true, true);
    grads[0].pow(2).sum().backward();
    std::vector<torch::Tensor> result{x.grad()};
    for (auto& g : take_grads(*lin)) result.push_back(g);
    return result;
  };
  const auto plain = step(false);
  ckpt::test::WarningCapture warnings;
  const auto checkpointed = step(true);
  EXPECT_FALSE(warnings.contains("create_graph=True"));
  ASSERT_EQ(plain.size(), checkpointed.size());
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(bit_equal(plain[i], checkpointed[i])) << i;
}

}  // namespace checkpoint_test
