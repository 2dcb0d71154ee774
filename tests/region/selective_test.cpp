// Selective checkpointing: CheckpointOptions().policy(...), save_matmuls(), save_ops(). Every
// policy gives the plain step's gradients to the bit; an operator the policy saves runs its
// kernel once per step; the kept memory lies between full recompute and none.

#include <ckpt/memory_tracker.h>
#include <ckpt/modules.h>
#include <ckpt/sequential.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "support/counted_scale.h"
#include "support/support.h"

#include <atomic>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace selective_test {

using ckpt::test::bit_equal;
using ckpt::test::take_grads;

using ckpt::test::counted_scale;
using ckpt::test::scale_kernel_calls;

struct Block : torch::nn::Module {
  Block()
      : fc1(register_module("fc1", torch::nn::Linear(16, 32))),
        fc2(register_module("fc2", torch::nn::Linear(32, 16))),
        dropout(register_module("dropout", torch::nn::Dropout(0.3))) {}
  at::Tensor forward(const at::Tensor& x) {
    return x + fc2(dropout(torch::gelu(fc1(torch::layer_norm(x, {16})))));
  }
  torch::nn::Linear fc1, fc2;
  torch::nn::Dropout dropout;
};

struct Step {
  at::Tensor output, input_grad;
  std::vector<at::Tensor> grads;
};

Step run_step(const std::shared_ptr<Block>& block, const at::Tensor& input,
              const c10::optional<ckpt::CheckpointOptions>& options) {
  torch::manual_seed(7);
  auto x = input.detach().requires_grad_();
  auto y = options ? ckpt::checkpoint(*options, block, x) : block->forward(x);
  y.square().sum().backward();
  return {y.detach(), x.grad(), take_grads(*block)};
}

void expect_same(const Step& a, const Step& b) {
  EXPECT_TRUE(bit_equal(a.output, b.output));
  EXPECT_TRUE(bit_equal(a.input_grad, b.input_grad));
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t i = 0; i < a.grads.size(); ++i) EXPECT_TRUE(bit_equal(a.grads[i], b.grads[i])) << i;
}

TEST(SelectiveTest, EveryPolicyGivesThePlainGradientsToTheBit) {
  torch::manual_seed(0);
  auto block = std::make_shared<Block>();
  const auto input = torch::randn({8, 16});
  const Step plain = run_step(block, input, c10::nullopt);
  expect_same(run_step(block, input, ckpt::CheckpointOptions()), plain);
  expect_same(run_step(block, input, ckpt::CheckpointOptions().policy(ckpt::save_matmuls())),
              plain);
  expect_same(
      run_step(block, input, ckpt::CheckpointOptions().policy(ckpt::save_ops({"aten::gelu"}))),
      plain);
  // Everything that can be kept is kept: the recompute reruns views, dropout's random draw and
  // in-place operators only.
  const auto keep_all =
      ckpt::SelectivePolicy([](const ckpt::OpCall&) { return ckpt::CheckpointPolicy::PreferSave; });
  expect_same(run_step(block, input, ckpt::CheckpointOptions().policy(keep_all)), plain);
}

// A GPT block on [batch, time, width] input: Linear on 3-d input, attention through matmul on
// 4-d views, a causal mask, softmax, dropout and LayerNorm.
struct AttentionBlock : torch::nn::Module {
  AttentionBlock()
      : qkv(register_module("qkv", torch::nn::Linear(16, 48))),
        proj(register_module("proj", torch::nn::Linear(16, 16))),
        fc1(register_module("fc1", torch::nn::Linear(16, 64))),
        fc2(register_module("fc2", torch::nn::Linear(64, 16))),
        dropout(register_module("dropout", torch::nn::Dropout(0.2))) {}
  at::Tensor forward(const at::Tensor& x) {
    const int64_t b = x.size(0), t = x.size(1);
    const auto parts = qkv(torch::layer_norm(x, {16})).view({b, t, 3, 2, 8});
    const auto q = parts.select(2, 0).transpose(1, 2), k = parts.select(2, 1).transpose(1, 2),
               v = parts.select(2, 2).transpose(1, 2);
    auto scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(8.0);
    scores = scores.masked_fill(torch::ones({t, t}, torch::kBool).triu(1),
                                -std::numeric_limits<float>::infinity());
    const auto mixed = torch::matmul(dropout(torch::softmax(scores, -1)), v);
    const auto h = x + dropout(proj(mixed.transpose(1, 2).reshape({b, t, 16})));
    return h + fc2(torch::gelu(fc1(torch::layer_norm(h, {16}))));
  }
  torch::nn::Linear qkv, proj, fc1, fc2;
  torch::nn::Dropout dropout;
};

// One training step of the attention block on `input`, checkpointed under `options` (plain
// without), from the same random state; `backwards` backward passes through its graph (the
// gradients add up).
Step attention_step(const std::shared_ptr<AttentionBlock>& block, const at::Tensor& input,
                    const c10::optional<ckpt::CheckpointOptions>& options, int backwards = 1) {
  torch::manual_seed(7);
  auto x = input.detach().requires_grad_();
  auto y = options ? ckpt::checkpoint(*options, block, x) : block->forward(x);
  const auto loss = y.square().sum();
  for (int i = 0; i < backwards; ++i) loss.backward({}, /*retain_graph=*/i + 1 < backwards);
  return Step{y.detach(), x.grad(), take_grads(*block)};
}

TEST(SelectiveTest, AttentionBlockGradientsAreThePlainOnesToTheBit) {
  torch::manual_seed(0);
  auto block = std::make_shared<AttentionBlock>();
  const auto input = torch::randn({2, 6, 16});
  auto step = [&](const c10::optional<ckpt::CheckpointOptions>& options) {
    return attention_step(block, input, options);
  };
  const Step plain = step(c10::nullopt);
  expect_same(step(ckpt::CheckpointOptions()), plain);
  expect_same(step(ckpt::CheckpointOptions().policy(ckpt::save_matmuls())), plain);
  for (const char* op :
       {"aten::mm", "aten::addmm", "aten::bmm", "aten::softmax", "aten::_softmax"}) {
    SCOPED_TRACE(op);
    expect_same(step(ckpt::CheckpointOptions().policy(ckpt::save_ops({op}))), plain);
  }
}

// Whatever subset of its operators a policy keeps, the step is the plain one to the bit, with one
// backward or two through a retained graph: views, in-place writes, random draws and
// multi-output operators among them (random subsets of the operators the attention block calls,
// as a policy sees them).
TEST(SelectiveTest, AnySubsetOfTheOperatorsGivesThePlainGradients) {
  torch::manual_seed(0);
  auto block = std::make_shared<AttentionBlock>();
  const auto input = torch::randn({2, 6, 16});
  std::set<std::string> seen;
  const auto record = ckpt::SelectivePolicy([&](const ckpt::OpCall& call) {
    seen.insert(call.name());
    return ckpt::CheckpointPolicy::PreferRecompute;
  });
  attention_step(block, input, ckpt::CheckpointOptions().policy(record));
  const std::vector<std::string> names(seen.begin(), seen.end());
  ASSERT_GE(names.size(), 10u);
  std::mt19937 random(1234);
  for (int backwards : {1, 2}) {
    const Step plain = attention_step(block, input, c10::nullopt, backwards);
    for (int trial = 0; trial < 30; ++trial) {
      std::vector<std::string> subset;
      for (const auto& name : names) {
        if (random() % 2) subset.push_back(name);
      }
      SCOPED_TRACE(::testing::PrintToString(subset) + " backwards " + std::to_string(backwards));
      const auto options = ckpt::CheckpointOptions().policy(ckpt::save_ops(subset));
      expect_same(attention_step(block, input, options, backwards), plain);
    }
  }
}

// Writes into the data of a kept output, through the tensor itself (mul_) and through an alias
// autograd does not track (Linear on 3-d input adds its bias in place into the _unsafe_view of
// the kept aten::mm). With nothing reading the data in between, the forward keeps the written
// data and the replay skips the writes; after a read, it keeps a copy taken before the write.
// An in-place dropout still draws its mask in the recompute.
TEST(SelectiveTest, InPlaceWritesIntoKeptDataKeepTheComputedValue) {
  torch::manual_seed(0);
  torch::nn::Linear linear(8, 8);
  const auto input = torch::randn({2, 3, 8});
  const std::function<at::Tensor(const at::Tensor&)> functions[] = {
      [&](const at::Tensor& t) { return linear(linear(t).mul_(3).tanh()).sin(); },
      [&](const at::Tensor& t) {
        at::Tensor h = linear(t);
        const at::Tensor total = h.sum();  // read: the mul_ after it cannot be absorbed
        h.mul_(3);
        return linear(h.tanh() * total).sin();
      },
      [&](const at::Tensor& t) {
        namespace F = torch::nn::functional;
        return linear(F::dropout(linear(t), F::DropoutFuncOptions().p(0.5).inplace(true))).sin();
      },
  };
  for (const auto& fn : functions) {
    auto step = [&](const c10::optional<ckpt::CheckpointOptions>& options) {
      torch::manual_seed(7);
      auto x = input.detach().requires_grad_();
      auto y = options ? ckpt::checkpoint(*options, fn, x) : fn(x);
      y.square().sum().backward();
      return Step{y.detach(), x.grad(), take_grads(*linear)};
    };
    const Step plain = step(c10::nullopt);
    const auto must_save = ckpt::SelectivePolicy([](const ckpt::OpCall& call) {
      return call.name() == "aten::mm" || call.name() == "aten::addmm"
                 ? ckpt::CheckpointPolicy::MustSave
                 : ckpt::CheckpointPolicy::PreferRecompute;
    });
    expect_same(step(ckpt::CheckpointOptions().policy(must_save)), plain);
    expect_same(step(ckpt::CheckpointOptions().policy(ckpt::save_matmuls())), plain);
  }
}

// Linear's bias add is absorbed into the kept product, not copied: a region's forward under
// save_matmuls peaks as under full recompute when the product is all it keeps.
TEST(SelectiveTest, LinearsBiasAddIsKeptWithItsProductNotCopied) {
  torch::manual_seed(0);
  torch::nn::Linear linear(256, 256);
  const auto x = torch::randn({4, 64, 256}, torch::requires_grad());
  auto fn = [&](const at::Tensor& t) { return linear(t).tanh(); };  // tanh saves its output
  ckpt::MemoryTracker tracker;
  auto forward_peak = [&](const ckpt::CheckpointOptions& options) {
    const int64_t before = tracker.current_bytes();
    tracker.reset_peak();
    const auto y = ckpt::checkpoint(options, fn, x);
    const int64_t peak = tracker.peak_bytes() - before;
    y.sum().backward();
    return peak;
  };
  const int64_t full = forward_peak(ckpt::CheckpointOptions());
  const int64_t product = 4 * 64 * 256 * 4;
  // Within less than a product (the selective region also keeps the CPU's RNG state, 5 KB).
  EXPECT_LT(forward_peak(ckpt::CheckpointOptions().policy(ckpt::save_matmuls())), full + product);
}

// The recompute writes into the kept product it was handed (the bias add): a second backward
// through the same region (retain_graph) recomputes that product instead of reusing it.
TEST(SelectiveTest, ASecondBackwardRecomputesWhatTheFirstWroteInto) {
  torch::manual_seed(0);
  torch::nn::Linear linear(8, 8);
  auto x = torch::randn({2, 3, 8}, torch::requires_grad());
  auto fn = [&](const at::Tensor& t) { return torch::tanh(linear(t)); };
  const auto expected = torch::autograd::grad({fn(x).square().sum()}, {x})[0];
  auto y = ckpt::checkpoint(ckpt::CheckpointOptions().policy(ckpt::save_matmuls()), fn, x);
  const auto loss = y.square().sum();
  const auto first = torch::autograd::grad({loss}, {x}, {}, /*retain_graph=*/true)[0];
  const auto second = torch::autograd::grad({loss}, {x})[0];
  EXPECT_TRUE(bit_equal(first, expected));
  EXPECT_TRUE(bit_equal(second, expected));
}

// The region returns a kept output and computes from it too; the caller then writes into the
// returned tensor. The recompute must not hand the written value to the operators after it.
TEST(SelectiveTest, AWriteIntoAReturnedKeptOutputIsSeen) {
  torch::manual_seed(0);
  torch::nn::Linear linear(8, 8);
  const auto input = torch::randn({4, 8});
  auto fn = [&](const at::Tensor& t) {
    auto h = linear(t);  // aten::addmm, kept
    return std::make_tuple(h, torch::tanh(h));
  };
  auto step = [&](const c10::optional<ckpt::CheckpointOptions>& options) {
    auto x = input.detach().requires_grad_();
    auto [h, y] = options ? ckpt::checkpoint(*options, fn, x) : fn(x);
    h.mul_(5);  // legal in plain autograd: addmm's backward does not read its output
    (y.square().sum() + h.sum()).backward();
    return Step{y.detach(), x.grad(), take_grads(*linear)};
  };
  const Step plain = step(c10::nullopt);
  expect_same(step(ckpt::CheckpointOptions().policy(ckpt::save_ops({"aten::addmm"}))), plain);
  auto must = ckpt::CheckpointOptions().policy(ckpt::SelectivePolicy([](const ckpt::OpCall& c) {
    return c.name() == "aten::addmm" ? ckpt::CheckpointPolicy::MustSave
                                     : ckpt::CheckpointPolicy::PreferRecompute;
  }));
  CKPT_EXPECT_THROWS_WITH(step(must), "was modified in place after the forward kept it");
}

TEST(SelectiveTest, ASavedOperatorsKernelRunsOncePerStep) {
  torch::manual_seed(0);
  torch::nn::Linear linear(8, 8);
  auto fn = [&](const at::Tensor& x) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("ckpt_test::counted_scale", "")
                               .typed<at::Tensor(const at::Tensor&)>();
    return torch::tanh(op.call(linear(x)));
  };
  const auto input = torch::randn({4, 8}, torch::requires_grad());
  auto kernel_calls_per_step = [&](const ckpt::CheckpointOptions& options) {
    scale_kernel_calls = 0;
    ckpt::checkpoint(options, fn, input).sum().backward();
    return scale_kernel_calls.load();
  };
  EXPECT_EQ(kernel_calls_per_step(ckpt::CheckpointOptions()), 2);  // forward and recompute
  EXPECT_EQ(kernel_calls_per_step(
                ckpt::CheckpointOptions().policy(ckpt::save_ops({"ckpt_test::counted_scale"}))),
            1);
  EXPECT_EQ(kernel_calls_per_step(ckpt::CheckpointOptions().policy(ckpt::save_matmuls())), 2);
}

TEST(SelectiveTest, SaveMatmulsKeepsMoreThanFullRecomputeAndLessThanNone) {
  torch::manual_seed(0);
  torch::nn::Sequential mlp;
  for (int i = 0; i < 4; ++i) {
    mlp->push_back(torch::nn::Linear(256, 256));
    mlp->push_back(torch::nn::GELU());
    mlp->push_back(torch::nn::LayerNorm(torch::nn::LayerNormOptions({256})));
  }
  const auto input = torch::randn({64, 256}, torch::requires_grad());
  ckpt::MemoryTracker tracker;
  auto kept_after_forward = [&](const c10::optional<ckpt::CheckpointOptions>& options) {
    const int64_t before = tracker.current_bytes();
    auto y = options ? ckpt::checkpoint(*options, mlp, input) : mlp->forward(input);
    const int64_t kept = tracker.current_bytes() - before;
    y.sum().backward();
    return kept;
  };
  const int64_t none = kept_after_forward(c10::nullopt);
  const int64_t full = kept_after_forward(ckpt::CheckpointOptions());
  const int64_t matmuls =
      kept_after_forward(ckpt::CheckpointOptions().policy(ckpt::save_matmuls()));
  const int64_t activation = 64 * 256 * 4;
  EXPECT_EQ(full, activation);                      // the output only
  EXPECT_EQ(matmuls, activation + 4 * activation);  // and the four matrix products
  EXPECT_GT(none, matmuls);
}

TEST(SelectiveTest, WorksWithAutogradGradDoubleBackwardAndNesting) {
  torch::manual_seed(0);
  torch::nn::Linear inner(6, 6), outer(6, 6);
  const auto policy = ckpt::CheckpointOptions().policy(ckpt::save_matmuls());
  auto fn = [&](const at::Tensor& x) {
    auto h = torch::tanh(outer(x));
    return ckpt::checkpoint(
        policy, [&](const at::Tensor& t) { return torch::sin(inner(t)); }, h);
  };
  const auto input = torch::randn({3, 6});
  auto x = input.detach().requires_grad_();
  auto plain = torch::sin(inner(torch::tanh(outer(x))));
  auto plain_grad = torch::autograd::grad({plain.sum()}, {x}, {}, /*retain_graph=*/true,
                                          /*create_graph=*/true)[0];
  auto plain_second = torch::autograd::grad({plain_grad.square().sum()}, {x})[0];

  auto y = input.detach().requires_grad_();
  auto checked = ckpt::checkpoint(policy, fn, y);
  auto grad = torch::autograd::grad({checked.sum()}, {y}, {}, /*retain_graph=*/true,
                                    /*create_graph=*/true)[0];
  EXPECT_TRUE(bit_equal(grad, plain_grad));
  EXPECT_TRUE(bit_equal(torch::autograd::grad({grad.square().sum()}, {y})[0], plain_second));
}

TEST(SelectiveTest, HonouredBySequentialAndCheckpointed) {
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Linear(8, 8), torch::nn::Tanh(), torch::nn::Linear(8, 8),
                              torch::nn::Tanh());
  const auto input = torch::randn({4, 8});
  auto x = input.detach().requires_grad_();
  model->forward(x).sum().backward();
  const auto expected = take_grads(*model);
  const auto options = ckpt::CheckpointOptions().policy(ckpt::save_matmuls());
  auto y = input.detach().requires_grad_();
  ckpt::checkpoint_sequential(model, 2, y, options).sum().backward();
  EXPECT_TRUE(bit_equal(y.grad(), x.grad()));
  auto grads = take_grads(*model);
  for (size_t i = 0; i < grads.size(); ++i) EXPECT_TRUE(bit_equal(grads[i], expected[i]));

  ckpt::Checkpointed wrapped(model, options);
  auto z = input.detach().requires_grad_();
  wrapped->forward(z).sum().backward();
  EXPECT_TRUE(bit_equal(z.grad(), x.grad()));
  grads = take_grads(*model);
  for (size_t i = 0; i < grads.size(); ++i) EXPECT_TRUE(bit_equal(grads[i], expected[i]));
}

TEST(SelectiveTest, ClearErrors) {
  torch::nn::Linear linear(4, 4);
  const auto x = torch::randn({2, 4}, torch::requires_grad());
  const auto keep = [](const char* name) {
    return ckpt::CheckpointOptions().policy(ckpt::SelectivePolicy([name](const ckpt::OpCall& c) {
      return c.name() == name ? ckpt::CheckpointPolicy::MustSave
                              : ckpt::CheckpointPolicy::PreferRecompute;
    }));
  };
  CKPT_EXPECT_THROWS_WITH(
      ckpt::checkpoint(
          keep("aten::relu_"), [](const at::Tensor& t) { return (t * 2).relu_(); }, x),
      "MustSave for aten::relu_, which writes into its arguments");
  CKPT_EXPECT_THROWS_WITH(
      ckpt::checkpoint(
          keep("aten::bernoulli"),
          [](const at::Tensor& t) { return t * torch::bernoulli(torch::ones_like(t) / 2); }, x),
      "which draws random numbers");
  CKPT_EXPECT_THROWS_WITH(
      ckpt::checkpoint(ckpt::CheckpointOptions().use_reentrant(true).policy(ckpt::save_matmuls()),
                       linear, x),
      "needs the non-reentrant variant");
}

// A backward that keeps no graph lets go of each kept output as the recompute takes it, as
// PyTorch's does: a product that nothing in the recomputed graph saves is freed before the
// gradients are computed, so the backward peaks no higher than under full recompute.
TEST(SelectiveTest, TheBackwardLetsGoOfKeptOutputsAsTheRecomputeTakesThem) {
  torch::manual_seed(0);
  const auto w = torch::randn({256, 256}, torch::requires_grad());
  const auto x = torch::randn({256, 256}, torch::requires_grad());
  auto fn = [&](const at::Tensor& t) { return (t.mm(w) * 2).sum(1); };  // mul saves nothing
  ckpt::MemoryTracker tracker;
  auto peak_over_the_step = [&](const ckpt::CheckpointOptions& options) {
    const int64_t before = tracker.current_bytes();
    const auto y = ckpt::checkpoint(options, fn, x);
    tracker.reset_peak();  // the backward's peak, over what was there before the forward
    torch::autograd::grad({y.sum()}, {x, w});
    return tracker.peak_bytes() - before;
  };
  const int64_t full = peak_over_the_step(ckpt::CheckpointOptions());
  EXPECT_EQ(peak_over_the_step(ckpt::CheckpointOptions().policy(ckpt::save_matmuls())), full);
}

// A backward that failed part-way, after the recompute had taken a kept output, can run again:
// the operator runs instead (PreferSave), or the error says why it can't (MustSave).
TEST(SelectiveTest, ABackwardRunAgainAfterAFailureRecomputesWhatItGaveUp) {
  torch::manual_seed(0);
  torch::nn::Linear linear(8, 8);
  const auto input = torch::randn({4, 8});
  bool fail = false;
  auto fn = [&](const at::Tensor& t) {
    auto h = linear(t);  // aten::addmm, kept
    TORCH_CHECK(!fail, "test: the recompute failed");
    return torch::tanh(h);
  };
  auto step = [&](const c10::optional<ckpt::CheckpointOptions>& options) {
    auto x = input.detach().requires_grad_();
    fail = false;
    const auto loss = (options ? ckpt::checkpoint(*options, fn, x) : fn(x)).sum();  // saves nothing
    if (options) {
      fail = true;
      CKPT_EXPECT_THROWS_WITH(loss.backward(), "test: the recompute failed");
      fail = false;
    }
    loss.backward();
    return Step{loss.detach(), x.grad(), take_grads(*linear)};
  };
  const Step plain = step(c10::nullopt);
  expect_same(step(ckpt::CheckpointOptions().policy(ckpt::save_ops({"aten::addmm"}))), plain);
  auto must = ckpt::CheckpointOptions().policy(ckpt::SelectivePolicy([](const ckpt::OpCall& c) {
    return c.name() == "aten::addmm" ? ckpt::CheckpointPolicy::MustSave
                                     : ckpt::CheckpointPolicy::PreferRecompute;
  }));
  CKPT_EXPECT_THROWS_WITH(step(must), "Pass retain_graph=true to the backward");
}

// A function that runs backward through its own intermediates inside the region (a gradient
// penalty, a physics-informed loss) works under a policy, as under PyTorch's selective
// checkpointing: the forward keeps its graph until it returns.
TEST(SelectiveTest, BackwardInsideTheForwardWorksUnderAPolicy) {
  const auto x = torch::randn({3}, torch::requires_grad());
  const auto penalised = [](const at::Tensor& t) {
    const at::Tensor y = torch::mm(t.view({1, 3}), t.view({3, 1})).pow(3);
    const at::Tensor g = torch::autograd::grad({y.sum()}, {t}, {}, true, true)[0];
    return (y.sum() + g.square().sum());
  };
  const at::Tensor plain = penalised(x);
  const at::Tensor plain_grad = torch::autograd::grad({plain}, {x})[0];
  for (const auto& options :
       {ckpt::CheckpointOptions().policy(ckpt::save_matmuls()), ckpt::CheckpointOptions()}) {
    const at::Tensor out = ckpt::checkpoint(options, penalised, x);
    EXPECT_TRUE(bit_equal(out, plain));
    EXPECT_TRUE(bit_equal(torch::autograd::grad({out}, {x})[0], plain_grad));
  }
}

// BatchNorm and dropout, then a backward through its own intermediates inside the forward (a
// gradient penalty), counting its calls.
struct Penalised : torch::nn::Module {
  Penalised()
      : norm(register_module("norm", torch::nn::BatchNorm1d(3))),
        dropout(register_module("dropout", torch::nn::Dropout(0.5))) {}
  at::Tensor forward(const at::Tensor& t) {
    ++calls;
    const at::Tensor y = dropout(norm(t)).tanh().pow(3);
    const at::Tensor g = torch::autograd::grad({y.sum()}, {t}, {}, true, true)[0];
    return y.sum() + g.square().sum();
  }
  torch::nn::BatchNorm1d norm;
  torch::nn::Dropout dropout;
  int calls = 0;
};

// Such a function fails on the saved tensors that the policy's forward let go of; the region
// runs it again keeping them, from the same random state and module buffers, and keeps them at
// that call site from then on. Values, gradients, the random stream after the step and
// BatchNorm's statistics are those of one plain run; also where a lambda captures the module, out
// of the region's sight (the forward's watch of outside writes puts its statistics back before
// the second run: they moved twice before).
TEST(SelectiveTest, BackwardInsideTheForwardRunsTheFunctionAgainOnce) {
  auto module = std::make_shared<Penalised>();
  const auto input = torch::randn({4, 3});
  const auto buffers = ckpt::test::copy_buffers(*module);
  const auto captured = [&module](const at::Tensor& t) { return module->forward(t); };
  auto step = [&](bool checkpointed, bool capture) {
    ckpt::test::restore_buffers(*module, buffers);
    module->calls = 0;
    torch::manual_seed(3);
    auto x = input.detach().requires_grad_();
    const auto options = ckpt::CheckpointOptions().policy(ckpt::save_matmuls());
    const at::Tensor out = !checkpointed ? module->forward(x)
                           : capture     ? ckpt::checkpoint(options, captured, x)
                                         : ckpt::checkpoint(options, module, x);
    const at::Tensor grad = torch::autograd::grad({out}, {x})[0];
    return std::vector<at::Tensor>{out, grad, torch::rand({2}), module->norm->running_mean.clone(),
                                   module->norm->running_var.clone()};
  };
  for (bool capture : {false, true}) {
    const auto plain = step(false, capture);
    for (int run = 0; run < 2; ++run) {
      SCOPED_TRACE(std::string(capture ? "captured" : "an argument") + ", run " +
                   std::to_string(run));
      const auto checkpointed = step(true, capture);
      // The first run at this call site calls the function twice, the next once; the
      // backward's recompute adds one each time.
      EXPECT_EQ(module->calls, run == 0 ? 3 : 2);
      for (size_t i = 0; i < plain.size(); ++i)
        EXPECT_TRUE(bit_equal(checkpointed[i], plain[i])) << i;
    }
  }
}

// The same inside another selective region: the outer forward releases the inner function's
// nodes too, so the outer region runs again as well; both keep their graphs from then on.
TEST(SelectiveTest, BackwardInsideANestedSelectiveRegionRunsBothAgain) {
  auto module = std::make_shared<Penalised>();
  const auto input = torch::randn({4, 3});
  const auto options = ckpt::CheckpointOptions().policy(ckpt::save_matmuls());
  const auto buffers = ckpt::test::copy_buffers(*module);
  auto step = [&](bool checkpointed) {
    ckpt::test::restore_buffers(*module, buffers);
    torch::manual_seed(3);
    auto x = input.detach().requires_grad_();
    // The module is an argument, so that the outer region sees it too.
    const auto outer = [&](const std::shared_ptr<Penalised>& inner, const at::Tensor& t) {
      return ckpt::checkpoint(options, inner, t.sin()).cos();
    };
    const at::Tensor out =
        checkpointed ? ckpt::checkpoint(options, outer, module, x) : outer(module, x);
    const at::Tensor grad = torch::autograd::grad({out}, {x})[0];
    return std::vector<at::Tensor>{out, grad, torch::rand({2}), module->norm->running_mean.clone()};
  };
  // Plain: the inner region alone is checkpointed (it keeps its graph from its own first run).
  const auto plain = step(false);
  for (int run = 0; run < 2; ++run) {
    SCOPED_TRACE(run);
    const auto checkpointed = step(true);
    for (size_t i = 0; i < plain.size(); ++i)
      EXPECT_TRUE(bit_equal(checkpointed[i], plain[i])) << i;
  }
}

// Issue 28, item 3: the second run is triggered by ckpt's own signal (a pre-hook on each node the
// forward released), not by an error's text. A function's own error that happens to say "a second
// time" propagates at once, after one run: it used to run the function again and switch the call
// site to keeping its graph.
TEST(SelectiveTest, AnErrorThatOnlySaysASecondTimeIsNotRetried) {
  int calls = 0;
  const auto fn = [&calls](const at::Tensor& t) {
    ++calls;
    auto h = t.sin().cos();  // cos consumes sin's output: the forward releases sin's node
    TORCH_CHECK(h.numel() == 0, "the function's own error, raised a second time");
    return h;
  };
  const auto x = torch::randn({3}, torch::requires_grad());
  const auto options = ckpt::CheckpointOptions().policy(ckpt::save_matmuls());
  CKPT_EXPECT_THROWS_WITH(ckpt::checkpoint(options, fn, x), "the function's own error");
  EXPECT_EQ(calls, 1);
}
}  // namespace selective_test

namespace selective_test {

// CheckpointOptions().debug(true): a recompute that runs other operators than the forward stops
// with both sequences side by side; one that runs the same passes and changes nothing.
TEST(CheckpointDebugTest, ShowsBothOperatorSequencesWhereTheyPart) {
  torch::nn::Linear linear(4, 4);
  const auto x = torch::randn({2, 4}, torch::requires_grad());
  int calls = 0;
  auto branching = [&](const at::Tensor& t) {
    auto h = torch::tanh(linear(t));
    return ++calls == 1 ? h.sin() : h.cos();  // same shapes: only the operators tell
  };
  for (const bool reentrant : {false, true}) {
    calls = 0;
    const auto options = ckpt::CheckpointOptions().debug(true).use_reentrant(reentrant);
    auto y = ckpt::checkpoint(options, branching, x);
    try {
      y.sum().backward();
      ADD_FAILURE() << "expected the debug error";
    } catch (const c10::Error& e) {
      const std::string message = e.what_without_backtrace();
      EXPECT_NE(message.find("ran other operators than its forward, from operator #3"),
                std::string::npos)
          << message;
      EXPECT_NE(message.find("> #3"), std::string::npos) << message;
      EXPECT_NE(message.find("aten::sin"), std::string::npos) << message;
      EXPECT_NE(message.find("aten::cos"), std::string::npos) << message;
    }
  }
  auto plain = ckpt::checkpoint(
      ckpt::CheckpointOptions().debug(true).policy(ckpt::save_matmuls()),
      [&](const at::Tensor& t) { return torch::tanh(linear(t)); }, x);
  plain.sum().backward();
  const auto grad = x.grad().clone();
  x.mutable_grad() = at::Tensor();
  torch::tanh(linear(x)).sum().backward();
  EXPECT_TRUE(bit_equal(grad, x.grad()));
}

}  // namespace selective_test
