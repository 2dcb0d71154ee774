// RNG preservation: dropout inside a region replays the forward's masks; the caller's random
// stream is left as it would be without checkpointing; DefaultDeviceType.

#include <ckpt/checkpoint.h>

#include "autograd/rng_state.h"
#include "support/support.h"

#include <functional>
#include <memory>
#include <thread>

namespace checkpoint_rng_test {

using ckpt::test::bit_equal;

struct CheckpointRngTest : ckpt::test::SeedingFixture, ::testing::WithParamInterface<bool> {
  ckpt::CheckpointOptions options() const {
    return ckpt::CheckpointOptions().use_reentrant(GetParam());
  }
};

// Port of test_checkpoint_rng_cpu (test_utils.py), for both variants.
TEST_P(CheckpointRngTest, DropoutGradientsMatchUncheckpointedRun) {
  for (int i = 0; i < 5; ++i) {
    auto inp = torch::randn({20000}, torch::requires_grad());
    torch::nn::Dropout phase1, phase2;
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    auto generator_state = generator.get_state();
    auto out = ckpt::checkpoint(options(), phase2, phase1(inp));
    out.sum().backward();
    auto g1 = inp.grad().clone();

    generator.set_state(generator_state);
    inp.mutable_grad() = torch::Tensor();
    out = phase2(phase1(inp));
    out.sum().backward();
    EXPECT_TRUE(bit_equal(g1, inp.grad()));
  }
}

TEST_P(CheckpointRngTest, RecomputeLeavesTheCallersRandomStreamUntouched) {
  torch::nn::Dropout dropout(0.5);
  auto x = torch::randn({100}, torch::requires_grad());
  torch::manual_seed(3);
  auto y = ckpt::checkpoint(options(), dropout, x);
  auto after_forward = torch::rand({4});
  torch::manual_seed(3);
  y = ckpt::checkpoint(options(), dropout, x);
  y.sum().backward();  // recomputes with the stashed state, then puts the caller's back
  EXPECT_TRUE(bit_equal(torch::rand({4}), after_forward));
}

TEST_P(CheckpointRngTest, WithoutPreservingRngStateItStillRuns) {
  // Port of test_checkpoint_not_preserve_rng_state_and_without_reentrant, on the CPU.
  auto inp = torch::randn({2}, torch::requires_grad());
  torch::nn::Dropout dropout;
  ckpt::checkpoint(options().preserve_rng_state(false), dropout, inp).sum().backward();
  EXPECT_TRUE(inp.grad().defined());
}

TEST_P(CheckpointRngTest, TransformerLikeBlockWithDropoutIsExact) {
  const int64_t d = 32;
  torch::nn::LayerNorm norm1(torch::nn::LayerNormOptions({d})),
      norm2(torch::nn::LayerNormOptions({d}));
  torch::nn::Linear qkv(d, 3 * d), proj(d, d), fc1(d, 4 * d), fc2(4 * d, d);
  torch::nn::Dropout attn_drop(0.1), resid_drop(0.1);
  auto block = [&](const torch::Tensor& x) {
    auto parts = qkv(norm1(x)).chunk(3, -1);
    auto scores = torch::softmax(parts[0].matmul(parts[1].transpose(-2, -1)) / std::sqrt(d), -1);
    auto h = x + resid_drop(proj(attn_drop(scores).matmul(parts[2])));
    return h + resid_drop(fc2(torch::gelu(fc1(norm2(h)))));
  };
  auto x = torch::randn({2, 10, d}, torch::requires_grad());
  std::vector<torch::Tensor> params = {qkv->weight, proj->weight, fc1->weight, fc2->weight,
                                       norm1->weight};
  params.insert(params.begin(), x);

  torch::manual_seed(11);
  auto expected = torch::autograd::grad({block(block(x)).pow(2).sum()}, params);
  torch::manual_seed(11);
  auto y = ckpt::checkpoint(options(), block, ckpt::checkpoint(options(), block, x));
  y.pow(2).sum().backward();
  std::vector<torch::Tensor> actual;
  for (const auto& p : params) actual.push_back(p.grad());
  for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(bit_equal(actual[i], expected[i])) << i;
}

// Another thread and the generator every thread shares. A step of the function below, checkpointed
// or not, has its gradient exactly where its output is not zero: a recompute that drew other masks
// breaks that (before the checks below it did, silently, in 65% of steps of two threads that ran
// such steps at once).
torch::Tensor two_dropouts(const torch::Tensor& t, const std::function<void()>& between) {
  auto h = torch::sin(torch::dropout(t, 0.5, true));
  between();
  return torch::dropout(h * 2, 0.5, true);
}

torch::Tensor positive_input() {
  return (torch::rand({64, 64}) + 0.5).requires_grad_();  // no zeros, and sin(2x) nowhere zero
}

// The gradient was taken through the forward's masks.
void expect_forward_masks(const torch::Tensor& x, const torch::Tensor& y) {
  EXPECT_TRUE(torch::equal(y.detach() != 0, x.grad() != 0));
}

// Runs `work` on another thread, and waits for it.
void on_another_thread(const std::function<void()>& work) {
  std::thread(work).join();
}

// Another thread draws once, between the region's two dropouts: in its forward (`in_call` 0) or in
// its recompute (1). The recompute can't draw the forward's masks: an error, not a wrong gradient.
TEST_P(CheckpointRngTest, AnotherThreadsDrawsInsideTheRegionAreAnError) {
  for (int in_call : {0, 1}) {
    SCOPED_TRACE(in_call);
    auto x = positive_input();
    auto calls = std::make_shared<int>(0);
    auto y = ckpt::checkpoint(
        options(),
        [calls, in_call](const torch::Tensor& t) {
          return two_dropouts(t, [&] {
            if ((*calls)++ == in_call) on_another_thread([] { torch::rand({100}); });
          });
        },
        x);
    CKPT_EXPECT_THROWS_WITH(y.sum().backward(), "drew other random numbers");
  }
}

// The same draws of another thread in the forward and the recompute, at other places: the
// generator ends where the forward left it, but the second mask of the recompute is not the
// forward's. Each draw is checked where it starts and ends.
TEST_P(CheckpointRngTest, AnotherThreadsDrawsElsewhereInTheRecomputeAreAnError) {
  auto x = positive_input();
  auto calls = std::make_shared<int>(0);
  auto draw = [] { on_another_thread([] { torch::rand({100}); }); };
  auto y = ckpt::checkpoint(
      options(),
      [calls, draw](const torch::Tensor& t) {
        const bool forward = (*calls)++ == 0;
        if (!forward) draw();  // the recompute: before its first mask
        return two_dropouts(t, [&] {
          if (forward) draw();  // the forward: between its masks
        });
      },
      x);
  CKPT_EXPECT_THROWS_WITH(y.sum().backward(), "drew other random numbers");
}

// A region that draws nothing is not disturbed by another thread's draws: checkpointed, exact.
TEST_P(CheckpointRngTest, ARegionThatDrawsNothingIgnoresAnotherThreadsDraws) {
  auto x = positive_input();
  auto calls = std::make_shared<int>(0);
  auto fn = [calls](const torch::Tensor& t) {
    auto h = torch::tanh(t * 3);
    if ((*calls)++ == 0) on_another_thread([] { torch::rand({100}); });  // in the forward only
    return torch::tanh(h);
  };
  ckpt::checkpoint(options(), fn, x).pow(2).sum().backward();
  const torch::Tensor grad = x.grad().clone();
  x.mutable_grad().reset();
  fn(x).pow(2).sum().backward();
  EXPECT_TRUE(bit_equal(grad, x.grad()));
}

// Another thread recomputes a region of its own (writing its stashed state into the generator,
// then the one it found) while this region's forward draws: the forward's second mask may come
// from that state. The default variant keeps this call's graph; the reentrant one, which records
// none, fails clearly.
TEST_P(CheckpointRngTest, AForwardBesideAnotherThreadsReplayKeepsItsGraph) {
  auto x = positive_input();
  auto replay = [] {
    auto z = torch::ones({100}, torch::requires_grad());
    auto drop = [](const torch::Tensor& t) { return torch::dropout(t, 0.5, true); };
    ckpt::checkpoint(drop, z).sum().backward();
  };
  auto calls = std::make_shared<int>(0);
  auto fn = [calls, replay](const torch::Tensor& t) {
    return two_dropouts(t, [&] {
      if ((*calls)++ == 0) on_another_thread(replay);
    });
  };
  if (GetParam()) {
    CKPT_EXPECT_THROWS_WITH(ckpt::checkpoint(options(), fn, x), "could not be checkpointed");
    return;
  }
  auto y = ckpt::checkpoint(options(), fn, x);
  EXPECT_NE(y.grad_fn()->name(), "ckpt::CheckpointBackward");
  y.sum().backward();
  expect_forward_masks(x, y);
}

INSTANTIATE_TEST_SUITE_P(Variants, CheckpointRngTest, ::testing::Values(false, true),
                         ckpt::test::VariantName());

TEST(DefaultDeviceTypeTest, SetAndGet) {
  // Unset, it is the current accelerator (CUDA with a GPU), else the CPU, as in PyTorch's newest.
  const auto fallback = ckpt::compat::current_accelerator().value_or(c10::DeviceType::CPU);
  EXPECT_EQ(ckpt::DefaultDeviceType::get_device_type(), fallback);
  ckpt::DefaultDeviceType::set_device_type(c10::DeviceType::Meta);
  EXPECT_EQ(ckpt::DefaultDeviceType::get_device_type(), c10::DeviceType::Meta);
  // With only CPU tensors, the default device type is the one inferred.
  EXPECT_EQ(ckpt::detail::infer_device_type({torch::randn({1})}), c10::DeviceType::Meta);
  ckpt::DefaultDeviceType::set_device_type(fallback);
}

TEST(DefaultDeviceTypeTest, InfersTheDeviceTypeOfNonCpuArguments) {
  // Port of test_infer_device_state_recursive_meta.
  auto meta = torch::empty({10}, torch::TensorOptions().device(torch::kMeta));
  EXPECT_EQ(ckpt::detail::infer_device_type({torch::randn({1}), meta}), c10::DeviceType::Meta);
}

}  // namespace checkpoint_rng_test
