// ckpt on an accelerator (the device suite): the device RNG stash and replay for both variants,
// nested regions, checkpoint_sequential, Checkpointed, PlannedSequential and a selective policy;
// arguments on two devices; DefaultDeviceType; autocast replay on the device type.

#include <ckpt/ckpt.h>
#include <ckpt/memory_tracker.h>
#include <ckpt/planned_sequential.h>

#include "device/device_suite.h"
#include "device/kernel_counter.h"

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace checkpoint_device_test {

using ckpt::test::bit_equal;
using ckpt::test::take_grads;

ckpt::CheckpointOptions variant(bool reentrant) {
  return ckpt::CheckpointOptions().use_reentrant(reentrant);
}

std::string variant_name(bool reentrant) {
  return reentrant ? "reentrant" : "non-reentrant";
}

// Linear, dropout and GELU: a block whose gradients depend on the dropout masks.
struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(int64_t width = 32)
      : linear(register_module("linear", torch::nn::Linear(width, width))),
        dropout(register_module("dropout", torch::nn::Dropout(0.3))) {}
  at::Tensor forward(const at::Tensor& x) { return torch::gelu(dropout(linear(x))); }
  torch::nn::Linear linear;
  torch::nn::Dropout dropout;
};
TORCH_MODULE(Block);

// The gradients of one step: of the input, then of every parameter of `module`.
std::vector<at::Tensor> step_gradients(const torch::nn::Module& module, const at::Tensor& input,
                                       const std::function<at::Tensor(const at::Tensor&)>& run) {
  auto x = input.detach().requires_grad_();
  run(x).pow(2).sum().backward();
  std::vector<at::Tensor> grads{x.grad()};
  for (auto& g : take_grads(module)) grads.push_back(g);
  return grads;
}

void expect_bit_equal(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(bit_equal(a[i], b[i])) << "gradient " << i;
}

class CheckpointDeviceTest : public ckpt::test::DeviceTest {
 protected:
  // The gradients of `run` and of `plain` from the same device RNG state must be the same bits.
  void expect_exact(const torch::nn::Module& module, const at::Tensor& input,
                    const std::function<at::Tensor(const at::Tensor&)>& run,
                    const std::function<at::Tensor(const at::Tensor&)>& plain) {
    const auto state = rng_state(0);
    const auto checkpointed = step_gradients(module, input, run);
    const auto after_checkpointed = rng_state(0);
    set_rng_state(0, state);
    const auto expected = step_gradients(module, input, plain);
    expect_bit_equal(checkpointed, expected);
    // The recompute leaves the caller's random stream where the plain step leaves it.
    EXPECT_TRUE(bit_equal(after_checkpointed, rng_state(0)));
  }
};

// Port of test_checkpoint_rng_gpu (test/test_utils.py), for every device type and both variants.
TEST_P(CheckpointDeviceTest, DropoutGradientsMatchThePlainRunToTheBit) {
  CKPT_SKIP_IF(missing_rng());
  for (bool reentrant : {false, true}) {
    SCOPED_TRACE(variant_name(reentrant));
    auto inp = torch::randn({20000}, on()).requires_grad_();
    torch::nn::Dropout phase1, phase2;
    const auto state = rng_state(0);
    ckpt::checkpoint(variant(reentrant), phase2, phase1(inp)).sum().backward();
    const auto g1 = inp.grad().clone();
    set_rng_state(0, state);
    inp.mutable_grad() = torch::Tensor();
    phase2(phase1(inp)).sum().backward();
    EXPECT_TRUE(bit_equal(g1, inp.grad()));
  }
}

TEST_P(CheckpointDeviceTest, BlocksAndNestedRegionsGiveThePlainGradients) {
  CKPT_SKIP_IF(missing_rng());
  Block outer, inner;
  torch::nn::Sequential both(outer, inner);
  both->to(device());
  const auto input = torch::randn({16, 32}, on());
  const auto plain = [&](const at::Tensor& x) { return inner(outer(x)); };
  for (bool reentrant : {false, true}) {
    SCOPED_TRACE(variant_name(reentrant));
    expect_exact(
        *both, input,
        [&](const at::Tensor& x) { return ckpt::checkpoint(variant(reentrant), outer, x); },
        [&](const at::Tensor& x) { return outer(x); });
    const auto nested = [&](const at::Tensor& x) {
      return ckpt::checkpoint(
          variant(reentrant),
          [&](const at::Tensor& t) {
            return inner(ckpt::checkpoint(variant(reentrant), outer, torch::dropout(t, 0.2, true)));
          },
          x);
    };
    expect_exact(*both, input, nested,
                 [&](const at::Tensor& x) { return plain(torch::dropout(x, 0.2, true)); });
  }
}

// Keeps an intermediate for a loss of its own, outside the region's results.
struct StashingImpl : torch::nn::Module {
  StashingImpl() : linear(register_module("linear", torch::nn::Linear(32, 32))) {}
  at::Tensor forward(const at::Tensor& x) {
    stashed = torch::dropout(linear(x), 0.3, true).tanh();
    return stashed.pow(3).sigmoid();
  }
  torch::nn::Linear linear;
  at::Tensor stashed;
};
TORCH_MODULE(Stashing);

// A region's forward on the device lets go of its graph as it goes, as on the CPU: it peaks as
// the forward without autograd does (the device allocator's statistics). A function that keeps
// an intermediate outside the region runs again from the same device random state: the plain
// step's values, and its gradients up to the order in which the two paths' sums arrive.
TEST_P(CheckpointDeviceTest, AForwardLetsGoOfItsGraphAsOnTheCpu) {
  CKPT_SKIP_IF(missing_rng());
  if (!missing_memory_statistics()) {
    ckpt::MemoryTracker tracker(device());
    const auto x = torch::randn({256, 1024}, on()).requires_grad_();
    const auto chain = [](const at::Tensor& t) {  // each statement's temporaries die with it
      at::Tensor h = t.tanh();
      h = h.sigmoid();
      h = h.exp();
      return h.tanh().sum();
    };
    const auto peak_of = [&](const auto& forward) {
      const int64_t before = tracker.current_bytes();
      tracker.reset_peak();
      const at::Tensor out = forward();
      return tracker.peak_bytes() - before;
    };
    const int64_t without_autograd = peak_of([&] {
      torch::NoGradGuard no_grad;
      return chain(x);
    });
    EXPECT_GE(peak_of([&] { return chain(x); }), without_autograd + (2 << 20));
    // The region's bookkeeping on the device, if any: some KB (as on the CPU).
    EXPECT_LT(peak_of([&] { return ckpt::checkpoint(chain, x); }), without_autograd + (1 << 17));
  }
  Stashing module;
  module->to(device());
  const auto input = torch::randn({8, 32}, on());
  const auto step = [&](bool checkpointed) {
    auto x = input.detach().requires_grad_();
    const at::Tensor out = checkpointed ? ckpt::checkpoint(module, x) : module(x);
    const at::Tensor loss = out.sum() + module->stashed.square().sum();
    loss.backward();
    std::vector<at::Tensor> result{out, x.grad()};
    for (auto& g : take_grads(*module)) result.push_back(g);
    return result;
  };
  const auto state = rng_state(0);
  const auto checkpointed = step(true);
  set_rng_state(0, state);
  const auto plain = step(false);
  EXPECT_TRUE(bit_equal(checkpointed[0], plain[0]));
  for (size_t i = 1; i < plain.size(); ++i) {
    EXPECT_TRUE(torch::allclose(checkpointed[i], plain[i], 1e-5, 1e-6))
        << i << ": " << (checkpointed[i] - plain[i]).abs().max().item<float>() << " of "
        << plain[i].abs().max().item<float>();
  }
}

// A recompute in two passes (issue 48): both passes replay the device's random state, the first
// recompute at the call site (which sizes the function first) and the later ones alike.
TEST_P(CheckpointDeviceTest, TwoPassRecomputesGiveThePlainGradients) {
  CKPT_SKIP_IF(missing_rng());
  Block first, second, third;
  torch::nn::Sequential blocks(first, second, third);
  blocks->to(device());
  const auto input = torch::randn({16, 32}, on());
  const auto plain = [&](const at::Tensor& x) { return third(second(first(x))); };
  const auto two_passes = ckpt::CheckpointOptions().two_pass_recompute(true);
  for (int step = 0; step < 2; ++step) {
    SCOPED_TRACE(step);
    expect_exact(
        *blocks, input, [&](const at::Tensor& x) { return ckpt::checkpoint(two_passes, plain, x); },
        plain);
  }
}

TEST_P(CheckpointDeviceTest, ChainsGiveThePlainGradients) {
  CKPT_SKIP_IF(missing_rng());
  torch::nn::Sequential chain;
  for (int i = 0; i < 6; ++i) chain->push_back(Block());
  chain->to(device());
  const auto input = torch::randn({16, 32}, on());
  const auto plain = [&](const at::Tensor& x) { return chain->forward(x); };
  for (bool reentrant : {false, true}) {
    SCOPED_TRACE(variant_name(reentrant));
    expect_exact(
        *chain, input,
        [&](const at::Tensor& x) {
          return ckpt::checkpoint_sequential(chain, 3, x, variant(reentrant));
        },
        plain);
  }
  ckpt::Checkpointed wrapped(chain);
  expect_exact(
      *chain, input, [&](const at::Tensor& x) { return wrapped(x); }, plain);
  // A selective policy keeps the products and recomputes dropout: its masks are replayed.
  const auto selective = ckpt::CheckpointOptions().policy(ckpt::save_matmuls());
  for (const int64_t segments : {int64_t{2}, int64_t{6}}) {
    SCOPED_TRACE("selective, " + std::to_string(segments) + " segment(s)");
    expect_exact(
        *chain, input,
        [&](const at::Tensor& x) {
          return ckpt::checkpoint_sequential(chain, segments, x, selective);
        },
        plain);
  }
}

TEST_P(CheckpointDeviceTest, PlannedSequentialGivesThePlainGradients) {
  CKPT_SKIP_IF(missing_rng());
  CKPT_SKIP_IF(missing_memory_statistics());
  torch::nn::Sequential chain;
  for (int i = 0; i < 8; ++i) chain->push_back(Block(64));
  chain->to(device());
  const auto input = torch::randn({32, 64}, on());
  ckpt::PlannedSequential planned(
      chain, ckpt::Budget::minimum(),
      ckpt::PlannedSequentialOptions().count_parameter_gradients(false));
  planned->plan(input.detach().requires_grad_());     // as step_gradients' input
  ASSERT_GT(planned->prediction().forward_count, 8);  // it recomputes
  expect_exact(
      *chain, input, [&](const at::Tensor& x) { return planned(x); },
      [&](const at::Tensor& x) { return chain->forward(x); });
}

// Attention over a sequence: Linear layers (addmm), batched products (bmm), dropout.
struct AttentionImpl : torch::nn::Module {
  AttentionImpl()
      : qkv(register_module("qkv", torch::nn::Linear(16, 48))),
        proj(register_module("proj", torch::nn::Linear(16, 16))) {}
  at::Tensor forward(const at::Tensor& x) {
    const auto parts = qkv(x).chunk(3, -1);
    auto weights = torch::softmax(torch::matmul(parts[0], parts[1].transpose(-2, -1)) / 4.0, -1);
    return x + proj(torch::matmul(torch::dropout(weights, 0.2, is_training()), parts[2]));
  }
  torch::nn::Linear qkv, proj;
};
TORCH_MODULE(Attention);

TEST_P(CheckpointDeviceTest, SaveMatmulsKeepsTheDevicesMatrixProducts) {
  CKPT_SKIP_IF(missing_rng());
  if (!ckpt::test::KernelCounter::available(type())) {
    GTEST_SKIP() << "LibTorch " TORCH_VERSION " can't wrap this device type's kernels";
  }
  Attention block;
  block->to(device());
  const auto input = torch::randn({4, 8, 16}, on());
  const std::vector<std::string> products{"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"};
  // The device's matrix-product kernels that one step runs.
  const auto kernels_of = [&](const std::function<at::Tensor(const at::Tensor&)>& run) {
    ckpt::test::KernelCounter counter(type(), products);
    step_gradients(*block, input, run);
    return counter.calls();
  };
  const auto plain = [&](const at::Tensor& x) { return block(x); };
  const auto selective = ckpt::CheckpointOptions().policy(ckpt::save_matmuls());
  const int64_t plain_count = kernels_of(plain);
  int64_t forward_count = 0;
  {
    ckpt::test::KernelCounter counter(type(), products);
    block(input);
    forward_count = counter.calls();
  }
  ASSERT_GT(forward_count, 0);
  EXPECT_EQ(kernels_of([&](const at::Tensor& x) { return ckpt::checkpoint(block, x); }),
            plain_count + forward_count);  // full recompute: every product again
  EXPECT_EQ(kernels_of([&](const at::Tensor& x) { return ckpt::checkpoint(selective, block, x); }),
            plain_count);  // the products are kept, none runs again
  expect_exact(
      *block, input, [&](const at::Tensor& x) { return ckpt::checkpoint(selective, block, x); },
      plain);
}

// Another thread draws from the device's generator between the region's two dropouts, in its
// forward only: the recompute (on the device's engine thread) can't draw the forward's masks, and
// says so instead of taking the gradients through other ones.
TEST_P(CheckpointDeviceTest, AnotherThreadsDrawsOnTheDeviceInsideTheRegionAreAnError) {
  CKPT_SKIP_IF(missing_rng());
  const c10::Device on_device = device();
  auto x = (torch::rand({64, 64}, on()) + 0.5).requires_grad_();
  auto calls = std::make_shared<int>(0);
  auto y = ckpt::checkpoint(
      [calls, on_device](const at::Tensor& t) {
        auto h = torch::sin(torch::dropout(t, 0.5, true));
        if ((*calls)++ == 0) {
          std::thread([on_device] {
            torch::rand({100}, torch::TensorOptions().device(on_device));
          }).join();
        }
        return torch::dropout(h * 2, 0.5, true);
      },
      x);
  CKPT_EXPECT_THROWS_WITH(y.sum().backward(), "drew other random numbers");
}

// A tensor on the device that the function captures and reads with an operator that saves
// nothing of it, written on the device between the forward and the backward: the recompute (on
// the device's engine thread) would read the new values; it is an error before it runs, and the
// plain gradients once the write waits for the backward.
TEST_P(CheckpointDeviceTest, ACapturedTensorWrittenOnTheDeviceBeforeTheBackwardIsAnError) {
  const auto x = torch::randn({16, 16}, on()).requires_grad_();
  const auto shift = torch::randn({16}, on());
  const auto fn = [&shift](const at::Tensor& t) { return torch::sin(t + shift); };
  auto y = ckpt::checkpoint(fn, x).sum();
  shift.mul_(2);
  CKPT_EXPECT_THROWS_WITH(y.backward(), "a tensor of shape [16] that the region's function read");
  ckpt::checkpoint(fn, x).sum().backward();
  const at::Tensor checkpointed = x.grad().cpu();
  x.mutable_grad().reset();
  fn(x).sum().backward();
  EXPECT_TRUE(bit_equal(x.grad().cpu(), checkpointed));
}

// ~~~ Two devices ~~~

TEST_P(CheckpointDeviceTest, BothArgumentDevicesRngIsStashedAndReplayed) {
  CKPT_SKIP_IF(missing_rng());
  CKPT_SKIP_WITHOUT_TWO_DEVICES();
  Block first, second;
  first->to(device(0));
  second->to(device(1));
  torch::nn::Sequential both(first, second);
  const auto a = torch::randn({8, 32}, on(0)).requires_grad_();
  const auto b = torch::randn({8, 32}, on(1)).requires_grad_();
  const auto f = [&](const at::Tensor& x, const at::Tensor& y) {
    return first(x) + second(y).to(device(0));
  };
  for (bool reentrant : {false, true}) {
    SCOPED_TRACE(variant_name(reentrant));
    const auto states = std::make_pair(rng_state(0), rng_state(1));
    ckpt::checkpoint(variant(reentrant), f, a, b).pow(2).sum().backward();
    std::vector<at::Tensor> checkpointed{a.grad().clone(), b.grad().clone()};
    const auto after = std::make_pair(rng_state(0), rng_state(1));
    a.mutable_grad().reset();
    b.mutable_grad().reset();
    for (auto& g : take_grads(*both)) checkpointed.push_back(g);
    set_rng_state(0, states.first);
    set_rng_state(1, states.second);
    f(a, b).pow(2).sum().backward();
    std::vector<at::Tensor> plain{a.grad().clone(), b.grad().clone()};
    a.mutable_grad().reset();
    b.mutable_grad().reset();
    for (auto& g : take_grads(*both)) plain.push_back(g);
    expect_bit_equal(checkpointed, plain);
    EXPECT_TRUE(bit_equal(after.first, rng_state(0)));
    EXPECT_TRUE(bit_equal(after.second, rng_state(1)));
  }
}

// As PyTorch, ckpt stashes the RNG of the devices of the tensor arguments only (docs/mechanism.md):
// a function that moves a tensor to another device and draws random numbers there draws new ones
// in the recompute, where PyTorch's gradients come out silently other than the plain step's; ckpt's
// recompute says so. Passing a tensor of that device as an argument makes its RNG replayed.
TEST_P(CheckpointDeviceTest, RandomDrawsOnADeviceOutsideTheArgumentsAreReplayedOnlyWhenPassed) {
  CKPT_SKIP_IF(missing_rng());
  CKPT_SKIP_WITHOUT_TWO_DEVICES();
  const auto input = torch::randn({4096}, on(0));
  const auto on_device1 = torch::zeros({1}, on(1));
  const auto f = [&](const at::Tensor& x) {
    return torch::dropout(x.to(device(1)), 0.5, true).to(device(0));
  };
  const auto gradient = [&](const std::function<at::Tensor(const at::Tensor&)>& run) {
    auto x = input.detach().requires_grad_();
    run(x).pow(2).sum().backward();
    return x.grad();
  };
  const auto state = rng_state(1);
  const auto plain = gradient(f);
  set_rng_state(1, state);
  CKPT_EXPECT_THROWS_WITH(gradient([&](const at::Tensor& x) { return ckpt::checkpoint(f, x); }),
                          "as an argument to have its state stashed");
  set_rng_state(1, state);
  EXPECT_TRUE(bit_equal(gradient([&](const at::Tensor& x) {
                          return ckpt::checkpoint(
                              [&](const at::Tensor& t, const at::Tensor&) { return f(t); }, x,
                              on_device1);
                        }),
                        plain));
}

// ~~~ DefaultDeviceType ~~~

TEST_P(CheckpointDeviceTest, DefaultDeviceTypeFallsBackToTheCurrentAccelerator) {
  // As torch.utils.checkpoint.DefaultDeviceType in PyTorch's newest: the current accelerator
  // when none was set (here the emulated device, registered first, on LibTorch 2.9+), else CPU.
  const auto expected = ckpt::compat::current_accelerator().value_or(c10::DeviceType::CPU);
  EXPECT_EQ(ckpt::DefaultDeviceType::get_device_type(), expected);
  if (type() == c10::DeviceType::PrivateUse1 && ckpt::emulated_device::has_accelerator_hooks()) {
    EXPECT_EQ(expected, c10::DeviceType::PrivateUse1);
  }
}

// A region with CPU arguments only preserves the default device type's autocast state: the
// function's device work is recomputed under the forward's autocast.
TEST_P(CheckpointDeviceTest, TheDefaultDeviceTypesAutocastIsReplayedForCpuArguments) {
  CKPT_SKIP_IF(missing_autocast());
  // Through the fallback where this device type is the current accelerator (the emulated device
  // on LibTorch 2.9+); set explicitly otherwise (CUDA beside the emulated device).
  const bool through_fallback = ckpt::compat::current_accelerator() == type();
  const auto previous = ckpt::DefaultDeviceType::get_device_type();
  if (!through_fallback) ckpt::DefaultDeviceType::set_device_type(type());
  torch::nn::Linear layer(16, 16);
  layer->to(device());
  const auto input = torch::randn({4, 16});
  const auto f = [&](const at::Tensor& x) { return layer(x.to(device())).cpu(); };
  const auto run = [&](bool checkpointed) {
    auto x = input.detach().requires_grad_();
    at::Tensor y;
    {
      const ckpt::test::AutocastOn autocast(type());
      y = checkpointed ? ckpt::checkpoint(f, x) : f(x);
    }
    EXPECT_EQ(y.scalar_type(), ckpt::compat::autocast_dtype(type()));
    y.to(torch::kFloat).pow(2).sum().backward();
    std::vector<at::Tensor> grads{x.grad()};
    for (auto& g : take_grads(*layer)) grads.push_back(g);
    return grads;
  };
  const auto plain = run(false);
  expect_bit_equal(run(true), plain);
  if (!through_fallback) ckpt::DefaultDeviceType::set_device_type(previous);
}

// ~~~ Autocast ~~~

TEST_P(CheckpointDeviceTest, AutocastIsReplayedInTheRecompute) {
  CKPT_SKIP_IF(missing_autocast());
  torch::nn::Linear layer(64, 64);
  layer->to(device());
  const auto input = torch::randn({8, 64}, on());
  for (bool reentrant : {false, true}) {
    SCOPED_TRACE(variant_name(reentrant));
    const auto run = [&](bool checkpointed) {
      auto x = input.detach().requires_grad_();
      at::Tensor y;
      {
        // Autocast on for the forward only: the recompute, in backward, must replay it.
        const ckpt::test::AutocastOn autocast(type());
        y = checkpointed ? ckpt::checkpoint(variant(reentrant), layer, x) : layer(x);
      }
      EXPECT_EQ(y.scalar_type(), ckpt::compat::autocast_dtype(type()));
      y.to(torch::kFloat).pow(2).sum().backward();
      std::vector<at::Tensor> grads{x.grad()};
      for (auto& g : take_grads(*layer)) grads.push_back(g);
      return grads;
    };
    const auto plain = run(false);
    expect_bit_equal(run(true), plain);
  }
}

// A weight cast before the region in the same autocast context is in autocast's cast cache when
// the region's forward runs, and gone when its recompute runs (the context ended): the region
// casts inside itself in both passes. Failed before regions turned the cast cache off.
TEST_P(CheckpointDeviceTest, AWeightAutocastCachedBeforeTheRegionIsCastAgainInside) {
  CKPT_SKIP_IF(missing_autocast());
  torch::nn::Linear layer(16, 16);
  layer->to(device());
  const auto input = torch::randn({4, 16}, on());
  for (bool reentrant : {false, true}) {
    SCOPED_TRACE(variant_name(reentrant));
    const auto run = [&](bool checkpointed) {
      auto x = input.detach().requires_grad_();
      at::Tensor y;
      {
        const ckpt::test::AutocastOn autocast(type());
        const auto h = layer(x);  // caches the weight's cast
        y = checkpointed ? ckpt::checkpoint(variant(reentrant), layer, h) : layer(h);
      }
      y.to(torch::kFloat).pow(2).sum().backward();
      std::vector<at::Tensor> grads{x.grad()};
      for (auto& g : take_grads(*layer)) grads.push_back(g);
      return grads;
    };
    const auto plain = run(false);
    const auto checkpointed = run(true);
    // The weight's two uses no longer share one cast: its gradient sums them in float32 where the
    // plain run sums them in the cast's precision. The input's gradient is exact.
    ASSERT_EQ(checkpointed.size(), plain.size());
    EXPECT_TRUE(bit_equal(checkpointed[0], plain[0]));
    for (size_t i = 1; i < plain.size(); ++i) {
      EXPECT_TRUE(torch::allclose(checkpointed[i], plain[i], 1e-2, 1e-2)) << "gradient " << i;
    }
  }
}

CKPT_INSTANTIATE_DEVICE_SUITE(CheckpointDeviceTest);

}  // namespace checkpoint_device_test
