// ckpt::checkpoint_sequential: ports of PyTorch's tests (test_utils.py::TestCheckpoint), every
// overload and segment count, bad arguments, BatchNorm statistics, memory at √n segments.

#include <ckpt/memory_tracker.h>
#include <ckpt/recompute.h>
#include <ckpt/sequential.h>

#include "support/support.h"

#include <cmath>

namespace sequential_test {

using ckpt::test::bit_equal;
using ckpt::test::take_grads;

struct SequentialTest : ckpt::test::SeedingFixture, ::testing::WithParamInterface<bool> {
  ckpt::CheckpointOptions options() const {
    return ckpt::CheckpointOptions().use_reentrant(GetParam());
  }
};

torch::nn::Sequential six_layers() {
  return torch::nn::Sequential(torch::nn::Linear(100, 50), torch::nn::ReLU(),
                               torch::nn::Linear(50, 20), torch::nn::ReLU(),
                               torch::nn::Linear(20, 5), torch::nn::ReLU());
}

// The helper of test_utils.py: checkpoint_sequential gives the plain model's output, input
// gradient and every parameter gradient (bit for bit: the same ops in the same order).
void check_checkpoint_sequential(torch::nn::Sequential model, int64_t chunks,
                                 const torch::Tensor& input,
                                 const ckpt::CheckpointOptions& options) {
  auto x = input.detach().requires_grad_();
  auto expected = model->forward(x);
  expected.sum().backward();
  auto expected_x = x.grad().clone();
  auto expected_params = take_grads(*model);

  std::vector<torch::nn::AnyModule> list(model->begin(), model->end());
  std::vector<std::function<torch::Tensor(torch::Tensor)>> functions;
  for (auto& m : list) functions.push_back([m](torch::Tensor t) mutable { return m.forward(t); });
  for (int overload = 0; overload < 3; ++overload) {
    auto detached = input.detach().requires_grad_();
    auto out = overload == 0   ? ckpt::checkpoint_sequential(model, chunks, detached, options)
               : overload == 1 ? ckpt::checkpoint_sequential(list, chunks, detached, options)
                               : ckpt::checkpoint_sequential(functions, chunks, detached, options);
    EXPECT_TRUE(bit_equal(out, expected)) << "overload " << overload;
    out.sum().backward();
    EXPECT_TRUE(bit_equal(detached.grad(), expected_x)) << "overload " << overload;
    auto params = take_grads(*model);
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_TRUE(bit_equal(params[i], expected_params[i])) << "overload " << overload;
    }
  }
}

// Port of test_checkpoint (and of test_checkpoint_module_list: the list overload).
TEST_P(SequentialTest, MatchesThePlainModelForEveryOverload) {
  check_checkpoint_sequential(six_layers(), 2, torch::randn({1, 100}), options());
}

TEST_P(SequentialTest, MatchesForEverySegmentCount) {
  auto model = six_layers();
  auto input = torch::randn({3, 100});
  for (int64_t segments = 1; segments <= 6; ++segments) {
    SCOPED_TRACE(segments);
    check_checkpoint_sequential(model, segments, input, options());
  }
}

// A module that counts its forward calls (test_checkpoint_trigger's Net).
struct CounterImpl : torch::nn::Module {
  torch::Tensor forward(torch::Tensor x) {
    ++counter;
    return x * torch::tensor(2.0);
  }
  int counter = 0;
};
TORCH_MODULE(Counter);

// Port of test_checkpoint_trigger.
TEST_P(SequentialTest, CheckpointedSegmentsAreRecomputedOnce) {
  std::vector<Counter> modules;
  torch::nn::Sequential model;
  for (int i = 0; i < 10; ++i) {
    modules.emplace_back();
    model->push_back(modules.back());
  }
  for (auto& m : modules) EXPECT_EQ(m->counter, 0);
  auto out = ckpt::checkpoint_sequential(model, 2, torch::randn({3, 4}, torch::requires_grad()),
                                         options());
  for (auto& m : modules) EXPECT_EQ(m->counter, 1);
  out.sum().backward();
  for (int i = 0; i < 5; ++i) EXPECT_EQ(modules[i]->counter, 2) << i;
  for (int i = 5; i < 10; ++i) EXPECT_EQ(modules[i]->counter, 1) << i;
}

TEST_P(SequentialTest, DropoutIsReplayedExactly) {
  torch::nn::Sequential model(torch::nn::Linear(32, 32), torch::nn::Dropout(0.5), torch::nn::Tanh(),
                              torch::nn::Linear(32, 32), torch::nn::Dropout(0.5),
                              torch::nn::Linear(32, 8));
  auto x = torch::randn({16, 32}, torch::requires_grad());
  torch::manual_seed(5);
  auto expected = torch::autograd::grad({model->forward(x).sum()}, {x})[0];
  torch::manual_seed(5);
  ckpt::checkpoint_sequential(model, 3, x, options()).sum().backward();
  EXPECT_TRUE(bit_equal(x.grad(), expected));
}

INSTANTIATE_TEST_SUITE_P(Variants, SequentialTest, ::testing::Values(false, true),
                         ckpt::test::VariantName());

// Port of test_checkpoint_valid: reentrant rejects autograd::grad, non-reentrant supports it with
// create_graph.
TEST(SequentialVariantsTest, AutogradGradOnlyWithNonReentrant) {
  auto model = six_layers();
  auto x = torch::randn({1, 100}, torch::requires_grad());
  auto out =
      ckpt::checkpoint_sequential(model, 2, x, ckpt::CheckpointOptions().use_reentrant(true));
  CKPT_EXPECT_THROWS_WITH(torch::autograd::grad({out}, {x}, {torch::ones({1, 5})}, c10::nullopt,
                                                /*create_graph=*/true),
                          "incompatible with torch::autograd::grad()");
  auto plain = model->forward(x);
  auto expected = torch::autograd::grad({plain}, {x}, {torch::ones({1, 5})}, c10::nullopt, true);
  out = ckpt::checkpoint_sequential(model, 2, x);
  EXPECT_TRUE(bit_equal(out, plain));
  auto actual = torch::autograd::grad({out}, {x}, {torch::ones({1, 5})}, c10::nullopt, true);
  EXPECT_TRUE(bit_equal(actual[0], expected[0]));
}

TEST(SequentialInPlaceTest, ParameterUpdatedBeforeTheBackwardIsAnError) {
  for (const bool reentrant : {false, true}) {
    auto model = six_layers();
    auto x = torch::randn({1, 100}, torch::requires_grad());
    auto out =
        ckpt::checkpoint_sequential(model, 3, x, ckpt::CheckpointOptions().use_reentrant(reentrant))
            .sum();
    {
      torch::NoGradGuard no_grad;
      model->parameters().front().add_(1);
    }
    CKPT_EXPECT_THROWS_WITH(out.backward(), "a parameter of the region");
  }
}

TEST(SequentialArgumentsTest, RejectsBadSegmentCountsAndEmptyChains) {
  auto model = six_layers();
  auto x = torch::randn({1, 100});
  CKPT_EXPECT_THROWS_WITH(ckpt::checkpoint_sequential(model, 0, x), "segments must be at least 1");
  CKPT_EXPECT_THROWS_WITH(ckpt::checkpoint_sequential(model, -3, x), "but got -3");
  CKPT_EXPECT_THROWS_WITH(ckpt::checkpoint_sequential(torch::nn::Sequential(), 2, x),
                          "chain of functions is empty");
  CKPT_EXPECT_THROWS_WITH(ckpt::checkpoint_sequential(std::vector<torch::nn::AnyModule>{}, 2, x),
                          "is empty");
  torch::nn::Sequential null_holder(nullptr);
  CKPT_EXPECT_THROWS_WITH(ckpt::checkpoint_sequential(null_holder, 2, x), "null holder");
}

TEST(SequentialArgumentsTest, ClampsSegmentsAboveTheNumberOfFunctions) {
  // PyTorch 1.13 raises "range() arg 3 must not be zero" here.
  auto model = six_layers();
  auto x = torch::randn({2, 100}, torch::requires_grad());
  ckpt::test::WarningCapture warnings;
  check_checkpoint_sequential(model, 12, x, {});
  EXPECT_TRUE(warnings.contains("using 6 segments"));
}

// pytorch/pytorch#96136: the recompute must not update running statistics a second time.
TEST(SequentialBuffersTest, BatchNormStatisticsEqualThePlainStep) {
  for (bool reentrant : {false, true}) {
    torch::manual_seed(1);
    auto make = [] {
      return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::BatchNorm1d(16),
                                   torch::nn::ReLU(), torch::nn::Linear(16, 16),
                                   torch::nn::BatchNorm1d(16), torch::nn::Linear(16, 4));
    };
    auto plain = make();
    auto checkpointed = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(plain->clone());
    auto x = torch::randn({32, 8}, torch::requires_grad());  // reentrant needs it for any grad
    plain->forward(x).sum().backward();
    ckpt::checkpoint_sequential(torch::nn::Sequential(checkpointed), 3, x,
                                ckpt::CheckpointOptions().use_reentrant(reentrant))
        .sum()
        .backward();
    auto a = plain->named_buffers(), b = checkpointed->named_buffers();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_TRUE(bit_equal(a[i].value(), b[i].value())) << a[i].key();
    }
    auto pa = plain->parameters(), pb = checkpointed->parameters();
    for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(bit_equal(pa[i].grad(), pb[i].grad()));
  }
}

TEST(SequentialBuffersTest, IsRecomputingTellsFunctionsWhenTheyRunAgain) {
  int side_effects = 0;
  std::vector<std::function<torch::Tensor(torch::Tensor)>> functions(4, [&](torch::Tensor t) {
    if (!ckpt::is_recomputing()) ++side_effects;
    return t.sin();
  });
  auto x = torch::randn({3}, torch::requires_grad());
  EXPECT_FALSE(ckpt::is_recomputing());
  ckpt::checkpoint_sequential(functions, 2, x).sum().backward();
  EXPECT_EQ(side_effects, 4);
  EXPECT_FALSE(ckpt::is_recomputing());
}

// Activations dominate parameters here (batch 512, width 64), as in most training. A region holds
// its parameters' gradients until its backward returns them (so that each parameter's gradient is
// accumulated once per step), which costs more where parameters are as large as activations.
TEST(SequentialMemoryTest, SqrtNSegmentsHalveThePeakOfA64LayerMlp) {
  torch::nn::Sequential model;
  for (int i = 0; i < 32; ++i) {
    model->push_back(torch::nn::Linear(64, 64));
    model->push_back(torch::nn::Tanh());
  }
  for (auto& p : model->parameters()) p.mutable_grad() = torch::zeros_like(p);
  auto x = torch::randn({512, 64}, torch::requires_grad());
  ckpt::MemoryTracker tracker;
  auto step_peak = [&](int64_t segments) {
    x.mutable_grad() = torch::Tensor();
    tracker.reset_peak();
    const int64_t before = tracker.current_bytes();
    auto y = segments == 0 ? model->forward(x) : ckpt::checkpoint_sequential(model, segments, x);
    y.sum().backward();
    return tracker.peak_bytes() - before;
  };
  const int64_t plain = step_peak(0);
  const int64_t sqrt_n = step_peak(8);
  EXPECT_LE(sqrt_n * 2, plain) << "plain " << plain << " sqrt(n) " << sqrt_n;
}

// A module that reads a tensor requiring grad that it does not own (a weight tied to another
// module's, say): the region finds it on its border and gives it its gradient.
struct CapturesOutsideImpl : torch::nn::Module {
  explicit CapturesOutsideImpl(torch::Tensor outside) : outside(std::move(outside)) {}
  torch::Tensor forward(torch::Tensor x) { return x * outside; }
  torch::Tensor outside;
};
TORCH_MODULE(CapturesOutside);

TEST(SequentialBorderTest, ModuleReadingATensorItDoesNotOwnGetsItsGradient) {
  auto w = torch::randn({4}, torch::requires_grad());
  torch::nn::Sequential model{CapturesOutside(w), torch::nn::Tanh(), torch::nn::Tanh()};
  auto x = torch::randn({4}, torch::requires_grad());
  auto expected = torch::autograd::grad({model->forward(x).sum()}, {x, w});
  auto actual = torch::autograd::grad({ckpt::checkpoint_sequential(model, 2, x).sum()}, {x, w});
  EXPECT_TRUE(bit_equal(actual[0], expected[0]));
  EXPECT_TRUE(bit_equal(actual[1], expected[1]));
}

TEST(SequentialBorderTest, SegmentsSupportAutogradGradAndDoubleBackward) {
  std::vector<torch::nn::AnyModule> modules;
  modules.emplace_back(torch::nn::Linear(3, 3));
  modules.emplace_back(torch::nn::Tanh());
  modules.emplace_back(torch::nn::Linear(3, 3));
  auto x = torch::randn({2, 3}, torch::requires_grad());
  auto y = ckpt::checkpoint_sequential(modules, 2, x);
  auto g = torch::autograd::grad({y.pow(2).sum()}, {x}, {}, true, true)[0];
  torch::Tensor plain = x;
  for (auto& m : modules) plain = m.forward(plain);
  auto expected = torch::autograd::grad({plain.pow(2).sum()}, {x}, {}, true, true)[0];
  EXPECT_TRUE(bit_equal(g, expected));
  auto gg = torch::autograd::grad({g.sum()}, {x})[0];
  auto expected_gg = torch::autograd::grad({expected.sum()}, {x})[0];
  EXPECT_TRUE(ckpt::test::close(gg, expected_gg));
}

// A nested model (blocks, each a chain of two halves) joined into one chain of halves: the same
// modules in order, so checkpointing it at every segment count gives the nested model's step.
TEST(JoinChainsTest, JoinedHalvesAreTheNestedModelsStages) {
  torch::manual_seed(0);
  std::vector<torch::nn::Sequential> blocks;
  for (int i = 0; i < 3; ++i) {
    blocks.push_back(torch::nn::Sequential(torch::nn::Linear(6, 6), torch::nn::Tanh()));
  }
  torch::nn::Sequential chain = ckpt::join_chains(blocks);
  ASSERT_EQ(chain->size(), 6u);
  EXPECT_EQ(chain->ptr(2), blocks[1]->ptr(0));  // shared, not copied
  EXPECT_EQ(chain->named_children()[3].key(), "1_1");
  EXPECT_EQ(chain->parameters().size(), 6u);

  const auto input = torch::randn({5, 6});
  auto nested = [&](const torch::Tensor& x) {
    auto h = x;
    for (auto& block : blocks) h = block->forward(h);
    return h;
  };
  auto x = input.detach().requires_grad_();
  nested(x).sum().backward();
  const auto expected_x = x.grad().clone();
  const auto expected = take_grads(*chain);
  for (int64_t segments = 1; segments <= 6; ++segments) {
    chain->zero_grad();
    auto y = input.detach().requires_grad_();
    ckpt::checkpoint_sequential(chain, segments, y).sum().backward();
    EXPECT_TRUE(bit_equal(y.grad(), expected_x)) << segments << " segments";
    const auto grads = take_grads(*chain);
    for (size_t k = 0; k < grads.size(); ++k) EXPECT_TRUE(bit_equal(grads[k], expected[k]));
  }
  EXPECT_THROW(ckpt::join_chains({blocks[0], torch::nn::Sequential(nullptr)}), c10::Error);
}

TEST(JoinChainsTest, ChainOfAModuleListOfBlocks) {
  torch::nn::ModuleList blocks(torch::nn::Linear(4, 4), torch::nn::Linear(4, 4));
  torch::nn::Sequential chain = ckpt::chain_of<torch::nn::Linear>(blocks);
  ASSERT_EQ(chain->size(), 2u);
  EXPECT_EQ(chain->ptr(1), blocks->ptr(1));
  const auto x = torch::randn({3, 4});
  EXPECT_TRUE(bit_equal(chain->forward(x), blocks[1]->as<torch::nn::Linear>()->forward(
                                               blocks[0]->as<torch::nn::Linear>()->forward(x))));
  EXPECT_EQ(ckpt::chain_of<torch::nn::LinearImpl>(blocks)->size(), 2u);

  blocks->push_back(torch::nn::ReLU());
  try {
    ckpt::chain_of<torch::nn::Linear>(blocks);
    ADD_FAILURE() << "expected an error";
  } catch (const c10::Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("block 2 of the ModuleList is a torch::nn::ReLU"), std::string::npos)
        << message;
    EXPECT_NE(message.find("LinearImpl"), std::string::npos) << message;
  }
}

}  // namespace sequential_test
