// Issue 29, item 1: a block that applies an in-place operation to its own input (ResNet's
// relu_ on the block input, say). The first call at a place learns it (the default and selective
// variants keep that call's graph, with a warning; the reentrant one fails clearly), and later
// calls copy the argument before the function, so that the recompute starts from its value
// before the write.

#include <ckpt/ckpt.h>
#include <ckpt/modules.h>
#include <ckpt/sequential.h>

#include "support/support.h"

#include <string>

namespace in_place_input_test {

using ckpt::test::bit_equal;
using ckpt::test::take_grads;

// Writes into its input first, as a ResNet block that starts with relu_ does; dropout so that
// the recompute must replay the random stream too.
struct InPlaceBlockImpl : torch::nn::Module {
  InPlaceBlockImpl() : linear(register_module("linear", torch::nn::Linear(16, 16))) {}
  torch::Tensor forward(torch::Tensor x) {
    x.mul_(0.5).relu_();
    return torch::dropout(torch::tanh(linear(x)), 0.25, is_training());
  }
  torch::nn::Linear linear;
};
TORCH_MODULE(InPlaceBlock);

struct Result {
  torch::Tensor input_grad;
  std::vector<torch::Tensor> grads;
};

// One step: a stem, the block (through `call`) with a residual that reads the written input.
template <class Call>
Result step(torch::nn::Linear stem, InPlaceBlock block, Call call) {
  torch::manual_seed(4);
  auto x = torch::randn({6, 16}, torch::requires_grad());
  auto h = stem(x);
  auto y = call(block, h) + h;  // h as the block left it, as without checkpointing
  y.pow(2).sum().backward();
  Result result{x.grad(), take_grads(*stem)};
  for (auto& g : take_grads(*block)) result.grads.push_back(g);
  return result;
}

InPlaceBlock copy_of(const InPlaceBlock& block) {
  InPlaceBlock copy;
  const torch::NoGradGuard no_grad;
  copy->linear->weight.copy_(block->linear->weight);
  copy->linear->bias.copy_(block->linear->bias);
  return copy;
}

void expect_same(const Result& a, const Result& b) {
  EXPECT_TRUE(bit_equal(a.input_grad, b.input_grad));
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t i = 0; i < a.grads.size(); ++i) EXPECT_TRUE(bit_equal(a.grads[i], b.grads[i])) << i;
}

struct InPlaceInputTest : ckpt::test::SeedingFixture {
  torch::nn::Linear stem{16, 16};
  InPlaceBlock block;
  Result plain() {
    return step(stem, block, [](InPlaceBlock b, const torch::Tensor& t) { return b(t); });
  }
};

TEST_F(InPlaceInputTest, DefaultVariantKeepsTheFirstCallsGraphThenCopiesTheArgument) {
  const Result expected = plain();
  int checkpointed = 0;
  for (int call = 0; call < 3; ++call) {
    ckpt::test::WarningCapture warnings;
    const Result actual = step(stem, block, [&](InPlaceBlock b, const torch::Tensor& t) {
      auto out = ckpt::checkpoint(b, t);
      checkpointed += out.grad_fn()->name() == "ckpt::CheckpointBackward";
      return out;
    });
    expect_same(actual, expected);
    EXPECT_EQ(warnings.contains("wrote into its tensor argument #0"), call == 0);
  }
  EXPECT_EQ(checkpointed, 2);  // all but the first call
}

// Issue 46, item 1: an argument that is a view (an alias, as a planner passes; a slice of a larger
// tensor) and is written into: the write goes to its base in the forward's graph, and the
// recompute, starting from a copy of the base, leads there too (it failed with "a gradient edge
// into AliasBackward0").
TEST_F(InPlaceInputTest, AViewArgumentWrittenIntoGivesThePlainGradients) {
  const auto views = {
      std::make_pair(
          "alias", +[](const torch::Tensor& h) { return h.alias(); }),
      std::make_pair(
          "rows 1-4 of 6", +[](const torch::Tensor& h) { return h.narrow(0, 1, 4); }),
      std::make_pair(
          "transposed twice", +[](const torch::Tensor& h) { return h.t().t(); })};
  for (const auto& [name, view] : views) {
    SCOPED_TRACE(name);
    const auto expected = step(stem, block, [&](InPlaceBlock b, const torch::Tensor& h) {
      return b(view(h)).sum(0, true) + h.sum(0, true);
    });
    InPlaceBlock fresh = copy_of(block);  // learns on its own call site
    for (int call = 0; call < 2; ++call) {
      SCOPED_TRACE(call);
      ckpt::test::WarningCapture warnings;
      const auto actual = step(stem, fresh, [&](InPlaceBlock b, const torch::Tensor& h) {
        return ckpt::checkpoint(b, view(h)).sum(0, true) + h.sum(0, true);
      });
      EXPECT_TRUE(bit_equal(actual.input_grad, expected.input_grad));
      ASSERT_EQ(actual.grads.size(), expected.grads.size());
      for (size_t i = 0; i < 2; ++i)
        EXPECT_TRUE(bit_equal(actual.grads[i], expected.grads[i])) << i;
    }
  }
}

// The selective variant as the default one: its forward lets go of nothing from the write on, so
// the first call keeps its graph (it failed once before, having let go of it).
TEST_F(InPlaceInputTest, SelectiveVariantKeepsTheFirstCallsGraphThenCopies) {
  const Result expected = plain();
  InPlaceBlock fresh = copy_of(block);  // a module of its own: its call site learned nothing
  const auto call = [&](InPlaceBlock b, const torch::Tensor& t) {
    return ckpt::checkpoint(ckpt::CheckpointOptions().policy(ckpt::save_matmuls()), b, t);
  };
  for (int run = 0; run < 3; ++run) expect_same(step(stem, fresh, call), expected);
}

// The reentrant forward runs without autograd: the residual would read the written values but
// differentiate the unwritten ones, so every call is refused while the argument requires grad.
TEST_F(InPlaceInputTest, ReentrantVariantRefusesAWriteIntoAnArgumentThatRequiresGrad) {
  const auto call = [&](InPlaceBlock b, const torch::Tensor& t) {
    return ckpt::checkpoint(ckpt::CheckpointOptions().use_reentrant(true), b, t);
  };
  for (int attempt = 0; attempt < 2; ++attempt) {
    CKPT_EXPECT_THROWS_WITH(step(stem, block, call), "use_reentrant(true)");
  }
  // An argument that needs no gradient (a mask) is copied from the second call on.
  const auto x = torch::randn({6, 16}, torch::requires_grad());
  const auto mask = torch::rand({6, 16});
  const auto scaled = [](const torch::Tensor& t, torch::Tensor m) {
    m.mul_(2);
    return torch::tanh(t * m);
  };
  const auto run = [&](bool checkpointed) {
    auto m = mask.clone();
    auto out = checkpointed
                   ? ckpt::checkpoint(ckpt::CheckpointOptions().use_reentrant(true), scaled, x, m)
                   : scaled(x, m);
    out.pow(2).sum().backward();
    EXPECT_TRUE(bit_equal(m, mask * 2));  // the caller sees the write, as without checkpointing
    auto grad = x.grad().clone();
    x.mutable_grad().reset();
    return grad;
  };
  const auto expected = run(false);
  CKPT_EXPECT_THROWS_WITH(run(true), "run it again");
  EXPECT_TRUE(bit_equal(run(true), expected));
  EXPECT_TRUE(bit_equal(run(true), expected));
}

// The same call site run with the default variant first (which learns to copy the argument), then
// with the reentrant one: the copy must not hide the write. It did: no error, and the input's
// gradient through the residual was 1 where the plain step's relu had made it 0.
TEST_F(InPlaceInputTest, ReentrantVariantRefusesTheWriteWhereTheDefaultOneLearnedToCopy) {
  const auto call_at_one_site = [&](const ckpt::CheckpointOptions& options) {
    return [options](InPlaceBlock b, const torch::Tensor& t) {
      return ckpt::checkpoint(options, b, t);
    };
  };
  InPlaceBlock fresh = copy_of(block);  // a call site of its own
  {
    ckpt::test::WarningCapture warnings;  // the default variant learns
    step(stem, fresh, call_at_one_site(ckpt::CheckpointOptions()));
  }
  for (int attempt = 0; attempt < 2; ++attempt) {
    for (auto& p : stem->parameters()) p.mutable_grad().reset();
    CKPT_EXPECT_THROWS_WITH(
        step(stem, fresh, call_at_one_site(ckpt::CheckpointOptions().use_reentrant(true))),
        "use_reentrant(true)");
  }
}

TEST_F(InPlaceInputTest, CheckpointedAndCheckpointSequentialLearnPerModule) {
  const Result expected = plain();
  ckpt::Checkpointed wrapped(block);
  for (int call = 0; call < 2; ++call) {
    expect_same(step(stem, block, [&](InPlaceBlock, const torch::Tensor& t) { return wrapped(t); }),
                expected);
  }
  // Another module through the same code has learned nothing: its first call warns again.
  InPlaceBlock other = copy_of(block);
  ckpt::Checkpointed wrapped_other(other);
  ckpt::test::WarningCapture warnings;
  expect_same(
      step(stem, other, [&](InPlaceBlock, const torch::Tensor& t) { return wrapped_other(t); }),
      expected);
  EXPECT_TRUE(warnings.contains("wrote into"));
}

// The block checkpointed inside another region: its first call learns in the outer forward (and
// keeps its graph there), so the outer recompute must make it again as that forward did, not as
// its site has learned since: without the copy, keeping its graph. It failed the first step's
// backward with "the recomputation of the region built a different autograd graph".
TEST_F(InPlaceInputTest, ANestedRegionThatLearnsInTheOuterForwardIsRecomputedAsItRan) {
  // The outer function hands the block a tensor of its own: its own argument is not written.
  const Result expected =
      step(stem, block, [](InPlaceBlock b, const torch::Tensor& t) { return b(t * 1.0); });
  for (int call = 0; call < 3; ++call) {
    ckpt::test::WarningCapture warnings;
    const Result actual = step(stem, block, [&](InPlaceBlock b, const torch::Tensor& t) {
      // By value: the recompute runs it after this lambda returned.
      auto outer = [b](const torch::Tensor& h) { return ckpt::checkpoint(b, h * 1.0); };
      auto out = ckpt::checkpoint(outer, t);
      EXPECT_EQ(out.grad_fn()->name(), "ckpt::CheckpointBackward");
      return out;
    });
    expect_same(actual, expected);
    EXPECT_EQ(warnings.contains("wrote into its tensor argument #0"), call == 0) << call;
  }
}

}  // namespace in_place_input_test
