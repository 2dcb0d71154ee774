// Bad input gets a clear error, and an exception leaves grad mode, RNG and autocast state as they
// were before the call.

#include <ckpt/checkpoint.h>
#include <ckpt/sequential.h>

#include "support/support.h"

#include <ATen/autocast_mode.h>

namespace checkpoint_errors_test {

using ckpt::test::bit_equal;

struct CheckpointErrorsTest : ckpt::test::SeedingFixture, ::testing::WithParamInterface<bool> {
  ckpt::CheckpointOptions options() const {
    return ckpt::CheckpointOptions().use_reentrant(GetParam());
  }
};

// Port of test_checkpoint_detects_non_determinism (the metadata case) for both variants.
TEST_P(CheckpointErrorsTest, DeterminismCheckNamesTheOutputAndTheDifference) {
  int calls = 0;
  auto fn = [&](const torch::Tensor& x) {
    ++calls;
    return calls == 1 ? x.sin() : torch::cat({x, x}).sin();
  };
  auto a = torch::randn({1}, torch::requires_grad());
  auto out = ckpt::checkpoint(options(), fn, a);
  CKPT_EXPECT_THROWS_WITH(out.sum().backward(), "produced a tensor of shape [2]");
  calls = 0;  // and the message says how to find the operator
  CKPT_EXPECT_THROWS_WITH(ckpt::checkpoint(options(), fn, a).sum().backward(),
                          "check_values(true) names the first");
}

TEST_P(CheckpointErrorsTest, DeterminismCheckCanBeTurnedOff) {
  int calls = 0;
  auto fn = [&](const torch::Tensor& x) {
    ++calls;
    return calls == 1 ? x.sin() : x.cos();  // same metadata, different values: undetectable
  };
  auto a = torch::randn({3}, torch::requires_grad());
  ckpt::checkpoint(options().determinism_check(false), fn, a).sum().backward();
  EXPECT_TRUE(bit_equal(a.grad(), -a.detach().sin()));
}

// What the determinism check cannot see, the value check names, in both variants.
TEST_P(CheckpointErrorsTest, ValueCheckFindsWhatTheDeterminismCheckCannot) {
  int calls = 0;
  auto fn = [&](const torch::Tensor& x) {
    ++calls;
    return calls == 1 ? x.sin() : x.cos();
  };
  auto a = torch::randn({3}, torch::requires_grad());
  auto out = ckpt::checkpoint(options().check_values(true), fn, a);
  CKPT_EXPECT_THROWS_WITH(out.sum().backward(),
                          "ran aten::cos as its checked operator #0 where "
                          "the forward ran aten::sin");
}

TEST_P(CheckpointErrorsTest, DtypeChangeInRecomputeIsReported) {
  int calls = 0;
  auto fn = [&](const torch::Tensor& x) {
    return ++calls == 1 ? x * 2 : (x * 2).to(torch::kDouble);
  };
  auto a = torch::randn({3}, torch::requires_grad());
  auto out = ckpt::checkpoint(options(), fn, a);
  CKPT_EXPECT_THROWS_WITH(out.sum().backward(), "dtype Double");
}

TEST_P(CheckpointErrorsTest, InputModifiedInPlaceAfterForwardIsAnError) {
  auto a = torch::randn({3}, torch::requires_grad());
  auto x = a * 1;
  auto out = ckpt::checkpoint(
      options(), [](const torch::Tensor& t) { return t.exp(); }, x);
  {
    torch::NoGradGuard no_grad;
    x.add_(1);
  }
  CKPT_EXPECT_THROWS_WITH(out.sum().backward(), "modified in place after the forward pass");
}

// A weight updated in place between forward and backward: plain autograd raises "modified by an
// inplace operation" for the weights it saved; ckpt raises for the parameters a recompute would
// read again: the modules' in both variants, captured ones in the non-reentrant variant, which
// finds them at its border.
TEST_P(CheckpointErrorsTest, ModuleParameterUpdatedBeforeTheBackwardIsAnError) {
  torch::nn::Linear layer(3, 4);
  auto x = torch::randn({2, 3}, torch::requires_grad());
  auto plain = layer(x).sum();
  auto out = ckpt::checkpoint(options(), layer, x).sum();
  {
    torch::NoGradGuard no_grad;
    layer->weight.sub_(0.1);
  }
  EXPECT_THROW(plain.backward(), c10::Error);
  CKPT_EXPECT_THROWS_WITH(out.backward(), "a parameter of the region (a tensor of shape [4, 3])");
}

TEST(CheckpointInPlaceTest, CapturedParameterUpdatedBeforeTheBackwardIsAnError) {
  auto w = torch::randn({3, 3}, torch::requires_grad());
  auto x = torch::randn({2, 3}, torch::requires_grad());
  auto out = ckpt::checkpoint([&](const torch::Tensor& t) { return t.mm(w).tanh(); }, x).sum();
  {
    torch::NoGradGuard no_grad;
    w.mul_(2);
  }
  CKPT_EXPECT_THROWS_WITH(out.backward(), "modified in place after the forward pass");
  // Updated after the backward, as a training loop does: no error, and the gradient is exact.
  auto again = ckpt::checkpoint([&](const torch::Tensor& t) { return t.mm(w).tanh(); }, x).sum();
  again.backward();
  auto expected = torch::autograd::grad({x.mm(w).tanh().sum()}, {w})[0];
  EXPECT_TRUE(bit_equal(w.grad(), expected));
}

// A hostile probe: a tensor the function captures and only reads (an addition saves nothing of
// it), written in place between the forward and the backward. Plain autograd is right, as no
// backward reads it; the recompute read its new values and gave other gradients, silently, in
// both variants (PyTorch's checkpoint too). A write the dispatcher sees moves the tensor's
// version counter: the region notes the counters of what its operators read from outside it and
// checks them before it recomputes, as it does its arguments'.
TEST_P(CheckpointErrorsTest, CapturedTensorWrittenBeforeTheBackwardIsAnError) {
  const torch::Tensor shift = torch::ones({2, 3});
  const torch::Tensor scale = torch::ones({2});
  const auto fn = [&](const torch::Tensor& t) {
    return (t + shift).sin() * scale[0].item<float>();  // item(): a value that may pick a branch
  };
  const auto x = torch::randn({2, 3}, torch::requires_grad());
  auto out = ckpt::checkpoint(options(), fn, x).sum();
  shift.add_(1);
  CKPT_EXPECT_THROWS_WITH(out.backward(),
                          "a tensor of shape [2, 3] that the region's function read (aten::add) "
                          "besides its arguments");
  out = ckpt::checkpoint(options(), fn, x).sum();
  scale.narrow(0, 1, 1).mul_(2);  // through a view: the counter is its base's
  CKPT_EXPECT_THROWS_WITH(out.backward(), "modified in place after the forward pass");
  // A captured tensor that requires grad (the reentrant variant finds no border to check it by).
  const torch::Tensor h = x * 2;
  out = ckpt::checkpoint(
            options(), [&](const torch::Tensor& t) { return (t + h).sin(); }, x)
            .sum();
  h.mul_(2);
  CKPT_EXPECT_THROWS_WITH(out.backward(), "modified in place after the forward pass");
  // Written after the backward, as a training loop does: no error, and the plain gradient.
  x.mutable_grad().reset();
  ckpt::checkpoint(options(), fn, x).sum().backward();
  shift.add_(1);
  const torch::Tensor checkpointed = x.grad().clone();
  x.mutable_grad().reset();
  shift.sub_(1);
  fn(x).sum().backward();
  EXPECT_TRUE(bit_equal(x.grad(), checkpointed));
}

// The same probe through a module's buffer that its forward reads and does not write (a
// positional table, a mask): checkpoint, its reentrant variant and checkpoint_sequential took
// the new values silently. A buffer the forward writes (BatchNorm's statistics) stays the
// region's to put back (the ResNet and BatchNorm tests).
struct ShiftedLinearImpl : torch::nn::Module {
  ShiftedLinearImpl() {
    shift = register_buffer("shift", torch::ones({3}));
    linear = register_module("linear", torch::nn::Linear(3, 3));
  }
  torch::Tensor forward(const torch::Tensor& x) { return linear(x + shift).sin(); }
  torch::Tensor shift;
  torch::nn::Linear linear{nullptr};
};
TORCH_MODULE(ShiftedLinear);

TEST_P(CheckpointErrorsTest, ModuleBufferWrittenBeforeTheBackwardIsAnError) {
  const ShiftedLinear block;
  const auto x = torch::randn({2, 3}, torch::requires_grad());
  const auto write = [&] {
    const torch::NoGradGuard no_grad;
    block->shift.add_(1);
  };
  auto out = ckpt::checkpoint(options(), block, x).sum();
  write();
  CKPT_EXPECT_THROWS_WITH(out.backward(), "a tensor of shape [3] that the region's function read");
  const torch::nn::Sequential chain(block, ShiftedLinear());
  out = ckpt::checkpoint_sequential(chain, 2, x, options()).sum();
  write();
  CKPT_EXPECT_THROWS_WITH(out.backward(), "modified in place after the forward pass");
}

// What the region writes itself, though it read it first, is state the recompute starts from as
// the forward found it, not a read that another region's forward may not write: two regions that
// share a captured counter, or a captured BatchNorm, run as the plain step.
TEST_P(CheckpointErrorsTest, StateTwoRegionsWriteIsNotAWriteAfterTheForward) {
  torch::nn::BatchNorm1d norm(3);
  torch::Tensor calls;
  const auto fn = [&](const torch::Tensor& t) {
    const torch::Tensor y = norm(norm(t + calls + norm->running_mean).sin());
    calls.add_(1);  // read, then written
    return y;
  };
  const auto x = torch::randn({4, 3}, torch::requires_grad());
  const auto step = [&](bool checkpointed) {
    torch::nn::BatchNorm1d fresh(3);
    norm = fresh;
    calls = torch::ones({1});
    x.mutable_grad().reset();
    const auto run = [&](const torch::Tensor& t) {
      return checkpointed ? ckpt::checkpoint(options(), fn, t) : fn(t);
    };
    (run(x) * run(x * 2)).sum().backward();
    return std::make_pair(x.grad().clone(), norm->running_mean.clone());
  };
  const auto plain = step(false);
  const auto checkpointed = step(true);
  EXPECT_TRUE(bit_equal(plain.first, checkpointed.first));
  EXPECT_TRUE(bit_equal(plain.second, checkpointed.second));
}

TEST_P(CheckpointErrorsTest, ExceptionInForwardLeavesStateAsItWas) {
  ckpt::compat::set_autocast_enabled(c10::DeviceType::CPU, false);
  auto rng_before = at::detail::getDefaultCPUGenerator().get_state();
  auto x = torch::randn({3}, torch::requires_grad());
  rng_before = at::detail::getDefaultCPUGenerator().get_state();
  EXPECT_THROW(ckpt::checkpoint(
                   options(),
                   [](const torch::Tensor& t) -> torch::Tensor {
                     torch::NoGradGuard inner;
                     ckpt::compat::set_autocast_enabled(c10::DeviceType::CPU, true);
                     ckpt::compat::set_autocast_enabled(c10::DeviceType::CPU, false);
                     throw std::runtime_error("boom");
                     return t;
                   },
                   x),
               std::runtime_error);
  EXPECT_TRUE(torch::GradMode::is_enabled());
  EXPECT_FALSE(ckpt::compat::autocast_enabled(c10::DeviceType::CPU));
  EXPECT_TRUE(bit_equal(at::detail::getDefaultCPUGenerator().get_state(), rng_before));
}

TEST_P(CheckpointErrorsTest, ExceptionInRecomputeReachesTheCallerAndRestoresState) {
  int calls = 0;
  torch::nn::Dropout dropout(0.5);
  auto fn = [&](const torch::Tensor& t) {
    if (++calls == 2) {
      auto consumed = torch::rand({10});  // advance the RNG before failing
      (void)consumed;
      throw std::runtime_error("recompute failed");
    }
    return dropout(t);
  };
  auto x = torch::randn({8}, torch::requires_grad());
  auto out = ckpt::checkpoint(options(), fn, x);
  auto rng_before = at::detail::getDefaultCPUGenerator().get_state();
  {
    ckpt::compat::set_autocast_enabled(c10::DeviceType::CPU, true);
    ckpt::compat::set_autocast_enabled(c10::DeviceType::CPU, false);
  }
  bool thrown = false;
  try {
    out.sum().backward();
  } catch (const std::exception& e) {
    thrown = std::string(e.what()).find("recompute failed") != std::string::npos;
  }
  EXPECT_TRUE(thrown);
  EXPECT_TRUE(torch::GradMode::is_enabled());
  EXPECT_FALSE(ckpt::compat::autocast_enabled(c10::DeviceType::CPU));
  EXPECT_TRUE(bit_equal(at::detail::getDefaultCPUGenerator().get_state(), rng_before));
}

// Issue 27, item 12: autograd's "Inference tensors do not track version counter" said neither
// which argument nor what to do.
TEST_P(CheckpointErrorsTest, InferenceTensorArgumentIsAClearError) {
  torch::Tensor x;
  {
    const c10::InferenceMode inference;
    x = torch::randn({4, 8});
  }
  torch::nn::Linear linear(8, 8);
  CKPT_EXPECT_THROWS_WITH(ckpt::checkpoint(options(), linear, x), "tensor argument #0");
  CKPT_EXPECT_THROWS_WITH(ckpt::checkpoint(options(), linear, x), "clone");
  EXPECT_TRUE(torch::GradMode::is_enabled());
  // A clone made outside InferenceMode is an ordinary tensor.
  ckpt::checkpoint(options(), linear, x.clone().requires_grad_()).sum().backward();
  EXPECT_TRUE(linear->weight.grad().defined());
}

INSTANTIATE_TEST_SUITE_P(Variants, CheckpointErrorsTest, ::testing::Values(false, true),
                         ckpt::test::VariantName());

TEST(CheckpointNonReentrantErrorsTest, RecomputeThatUsesAnotherTensorIsAnError) {
  auto w1 = torch::randn({3}, torch::requires_grad());
  auto w2 = torch::randn({3}, torch::requires_grad());
  int calls = 0;
  auto fn = [&](const torch::Tensor& x) { return x * (++calls == 1 ? w1 : w2); };
  auto x = torch::randn({3}, torch::requires_grad());
  auto out = ckpt::checkpoint(fn, x);
  CKPT_EXPECT_THROWS_WITH(out.sum().backward(), "that the forward pass did not use");
}

TEST(CheckpointReentrantErrorsTest, AutogradGradIsRejectedWithAFix) {
  // Port of test_checkpoint_valid_reset_on_error (test_autograd.py).
  auto a = torch::randn({2, 2}, torch::requires_grad());
  auto reentrant = ckpt::CheckpointOptions().use_reentrant(true);
  auto exp = [](const torch::Tensor& t) { return t.exp(); };
  CKPT_EXPECT_THROWS_WITH(torch::autograd::grad({ckpt::checkpoint(reentrant, exp, a).sum()}, {a}),
                          "incompatible with torch::autograd::grad()");
  // The flag is reset afterwards: a plain backward works.
  ckpt::checkpoint(reentrant, exp, a).sum().backward();
  EXPECT_TRUE(ckpt::test::close(a.grad(), a.detach().exp()));
}

TEST(CheckpointReentrantErrorsTest, BackwardWithInputsIsRejected) {
  auto a = torch::randn({2}, torch::requires_grad());
  auto out = ckpt::checkpoint(
      ckpt::CheckpointOptions().use_reentrant(true), [](const torch::Tensor& t) { return t.exp(); },
      a);
  CKPT_EXPECT_THROWS_WITH(torch::autograd::backward({out.sum()}, {}, c10::nullopt, false, {a}),
                          "use_reentrant(false)");
}

// Each lambda below has a type of its own, so each call site is new to the process.
TEST(CheckpointReentrantErrorsTest, WarnsWhenNoInputRequiresGrad) {
  ckpt::test::WarningCapture warnings;
  torch::nn::Linear linear(3, 3);
  auto out = ckpt::checkpoint(
      ckpt::CheckpointOptions().use_reentrant(true),
      [&](const torch::Tensor& x) { return linear(x); }, torch::randn({2, 3}));
  EXPECT_TRUE(warnings.contains("None of the inputs have requires_grad=True"));
  EXPECT_FALSE(out.requires_grad());
}

TEST(CheckpointReentrantErrorsTest, WarnsOncePerCallSiteNotOncePerCall) {
  ckpt::test::WarningCapture warnings;
  torch::nn::Linear linear(3, 3);
  const auto options = ckpt::CheckpointOptions().use_reentrant(true);
  for (int step = 0; step < 5; ++step) {
    ckpt::checkpoint(
        options, [&](const torch::Tensor& x) { return linear(x); }, torch::randn({2, 3}));
  }
  EXPECT_EQ(warnings.messages.size(), 1u);
  ckpt::checkpoint(
      options, [&](const torch::Tensor& x) { return linear(x) * 2; }, torch::randn({2, 3}));
  EXPECT_EQ(warnings.messages.size(), 2u);
}

TEST(CheckpointNonReentrantErrorsTest, NoWarningWhenNoInputRequiresGrad) {
  ckpt::test::WarningCapture warnings;
  torch::nn::Linear linear(3, 3);
  auto out = ckpt::checkpoint(linear, torch::randn({2, 3}));
  EXPECT_TRUE(warnings.messages.empty());
  EXPECT_TRUE(out.requires_grad());
}

// Port of test_checkpoint_partial_grad (test_utils.py).
TEST(CheckpointReentrantErrorsTest, PartialGradAndNoOutputRequiringGrad) {
  auto reentrant = ckpt::CheckpointOptions().use_reentrant(true);
  auto t1 = torch::rand({10}, torch::requires_grad());
  auto t2 = torch::rand({10});
  auto out = ckpt::checkpoint(
      reentrant,
      [](const torch::Tensor& a, const torch::Tensor& b) { return std::make_tuple(a, b); }, t1, t2);
  std::get<0>(out).sum().backward();
  EXPECT_TRUE(bit_equal(t1.grad(), torch::ones({10})));

  auto u1 = torch::rand({10});
  auto u2 = torch::rand({10}, torch::requires_grad());
  auto out2 = ckpt::checkpoint(
      reentrant, [](const torch::Tensor& a, const torch::Tensor&) { return a * 1; }, u1, u2);
  CKPT_EXPECT_THROWS_WITH(
      out2.sum().backward(),
      "none of the outputs has requires_grad=True, this checkpoint() is not necessary");
}

// Port of test_checkpointing_without_reentrant_detached_tensor, both variants.
TEST(CheckpointReentrantErrorsTest, NoGradInsideTheFunction) {
  torch::nn::Linear linear(torch::nn::LinearOptions(2, 2).bias(false));
  torch::nn::Linear lin2(torch::nn::LinearOptions(2, 2).bias(false));
  auto module = [&](const torch::Tensor& x) {
    torch::NoGradGuard no_grad;
    return lin2(linear(x));
  };
  auto a = torch::randn({2, 2}, torch::requires_grad());
  for (int i = 0; i < 3; ++i) {
    auto out = ckpt::checkpoint(ckpt::CheckpointOptions().use_reentrant(true), module, a);
    out = out + a;
    CKPT_EXPECT_THROWS_WITH(out.sum().backward(), "none of the outputs has requires_grad=True");
  }
  a.mutable_grad() = torch::Tensor();  // the failed backwards may have accumulated the `+ a` part
  for (int i = 0; i < 3; ++i) {
    auto out = ckpt::checkpoint(module, a);
    out = out + a;
    out.sum().backward();
  }
  EXPECT_TRUE(bit_equal(a.grad(), torch::full({2, 2}, 3.0)));
}

}  // namespace checkpoint_errors_test
