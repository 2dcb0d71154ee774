// The recompute of device tensors runs on the autograd engine's device thread, not the thread that
// called backward: grad mode, autocast, is_recomputing(), the selective replay mode and
// debug(true) behave there as on the calling thread (the device suite).

#include <ckpt/ckpt.h>
#include <ckpt/recompute.h>

#include "device/device_suite.h"
#include "device/kernel_counter.h"

#include <thread>
#include <vector>

namespace recompute_thread_test {

using ckpt::test::bit_equal;
using ckpt::test::take_grads;

// What the checkpointed function saw when it ran.
struct Seen {
  std::thread::id thread;
  bool grad_mode;
  bool recomputing;
  bool autocast;
};

class RecomputeThreadTest : public ckpt::test::DeviceTest {
 protected:
  // Runs `options`' region over a Linear layer, under autocast where the device type has it, and
  // its backward; returns what the function saw in the forward and in the recompute.
  std::vector<Seen> run(const ckpt::CheckpointOptions& options) {
    torch::nn::Linear layer(16, 16);
    layer->to(device());
    std::vector<Seen> seen;
    const auto f = [&](const at::Tensor& t) {
      seen.push_back({std::this_thread::get_id(), at::GradMode::is_enabled(),
                      ckpt::is_recomputing(), ckpt::compat::autocast_enabled(type())});
      return layer(t);
    };
    const auto x = torch::randn({4, 16}, on()).requires_grad_();
    at::Tensor y;
    {
      std::optional<ckpt::test::AutocastOn> autocast;
      if (!missing_autocast()) autocast.emplace(type());
      y = ckpt::checkpoint(options, f, x);
    }
    y.to(torch::kFloat).sum().backward();
    return seen;
  }
};

TEST_P(RecomputeThreadTest, RunsOnTheDeviceThreadWithTheForwardsState) {
  const auto caller = std::this_thread::get_id();
  const std::vector<std::pair<std::string, ckpt::CheckpointOptions>> variants{
      {"non-reentrant", ckpt::CheckpointOptions()},
      {"reentrant", ckpt::CheckpointOptions().use_reentrant(true)},
      {"selective", ckpt::CheckpointOptions().policy(ckpt::save_matmuls())},
      {"debug", ckpt::CheckpointOptions().debug(true)}};
  for (const auto& [name, options] : variants) {
    SCOPED_TRACE(name);
    const auto seen = run(options);
    ASSERT_EQ(seen.size(), 2u);
    const Seen& forward = seen[0];
    const Seen& recompute = seen[1];
    EXPECT_EQ(forward.thread, caller);
    EXPECT_NE(recompute.thread, caller);  // the engine's thread for the device
    EXPECT_FALSE(forward.recomputing);
    EXPECT_TRUE(recompute.recomputing);
    // The reentrant variant's forward runs without grad; every recompute records a graph.
    EXPECT_EQ(forward.grad_mode, !options.use_reentrant());
    EXPECT_TRUE(recompute.grad_mode);
    EXPECT_EQ(forward.autocast, !missing_autocast());
    EXPECT_EQ(recompute.autocast, forward.autocast);
  }
}

TEST_P(RecomputeThreadTest, SelectiveReplayKeepsTheProductsThere) {
  if (!ckpt::test::KernelCounter::available(type())) {
    GTEST_SKIP() << "LibTorch " TORCH_VERSION " can't wrap this device type's kernels";
  }
  torch::nn::Sequential block(torch::nn::Linear(16, 16), torch::nn::Tanh(),
                              torch::nn::Linear(16, 16));
  block->to(device());
  const auto x = torch::randn({4, 16}, on()).requires_grad_();
  // The products the backward's device kernels compute: its own (two per Linear), and those of a
  // full recompute (one per Linear), which the selective replay must not run again.
  const auto backward_products = [&](const ckpt::CheckpointOptions& options) {
    auto y = ckpt::checkpoint(options, block, x);
    ckpt::test::KernelCounter counter(type(), {"aten::mm", "aten::addmm"});
    y.sum().backward();
    take_grads(*block);
    return counter.calls();
  };
  const int64_t full = backward_products(ckpt::CheckpointOptions());
  const int64_t selective =
      backward_products(ckpt::CheckpointOptions().policy(ckpt::save_matmuls()));
  EXPECT_EQ(full - selective, 2);
}

TEST_P(RecomputeThreadTest, DebugReportsADifferentRecomputeFromTheDeviceThread) {
  torch::nn::Linear linear(4, 4);
  linear->to(device());
  const auto x = torch::randn({2, 4}, on()).requires_grad_();
  int calls = 0;
  const auto branching = [&](const at::Tensor& t) {
    const auto h = torch::tanh(linear(t));
    return ++calls == 1 ? h.sin() : h.cos();  // same shapes: only the operators tell
  };
  for (const bool reentrant : {false, true}) {
    SCOPED_TRACE(reentrant ? "reentrant" : "non-reentrant");
    calls = 0;
    auto y = ckpt::checkpoint(ckpt::CheckpointOptions().debug(true).use_reentrant(reentrant),
                              branching, x);
    try {
      y.sum().backward();
      ADD_FAILURE() << "expected the debug error";
    } catch (const c10::Error& e) {
      const std::string message = e.what_without_backtrace();
      EXPECT_NE(message.find("ran other operators than its forward"), std::string::npos) << message;
      EXPECT_NE(message.find("aten::sin"), std::string::npos) << message;
      EXPECT_NE(message.find("aten::cos"), std::string::npos) << message;
    }
  }
}

// A module's buffers move once per step: the recompute, on the device thread, knows it is one.
TEST_P(RecomputeThreadTest, BatchNormStatisticsMoveOncePerStep) {
  torch::manual_seed(3);
  torch::nn::Sequential plain(torch::nn::Linear(8, 8), torch::nn::BatchNorm1d(8));
  torch::manual_seed(3);
  torch::nn::Sequential wrapped(torch::nn::Linear(8, 8), torch::nn::BatchNorm1d(8));
  plain->to(device());
  wrapped->to(device());
  ckpt::Checkpointed checkpointed(wrapped);
  const auto x = torch::randn({6, 8}, on()).requires_grad_();
  for (int step = 0; step < 2; ++step) {
    plain->forward(x).pow(2).sum().backward();
    checkpointed(x).pow(2).sum().backward();
  }
  const auto a = plain->named_buffers(), b = wrapped->named_buffers();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(bit_equal(a[i].value().cpu(), b[i].value().cpu())) << a[i].key();
  }
  const auto ga = take_grads(*plain), gb = take_grads(*wrapped);
  for (size_t i = 0; i < ga.size(); ++i) EXPECT_TRUE(bit_equal(ga[i], gb[i])) << i;
}

// Issue 45, item 5: a group made after the forward, on the thread that calls backward, serves the
// recompute that runs on the device's thread: one recompute for a gradient penalty, and plain
// autograd's bits.
TEST_P(RecomputeThreadTest, AGroupMadeAfterTheForwardServesTheDevicesBackward) {
  if (!ckpt::compat::carries_thread_state()) {
    GTEST_SKIP() << "LibTorch " TORCH_VERSION " carries no group to the device's engine thread";
  }
  torch::manual_seed(5);
  torch::nn::Sequential block(torch::nn::Linear(5, 8), torch::nn::Tanh(), torch::nn::Linear(8, 5));
  block->to(device());
  int recomputes = 0;
  const auto f = [&](const at::Tensor& t) {
    if (ckpt::is_recomputing()) ++recomputes;
    return block->forward(t).sin();
  };
  const auto input = torch::randn({4, 5}, on());
  const auto penalised_step = [&](bool checkpointed) {
    const auto x = input.detach().requires_grad_();
    const auto loss = (checkpointed ? ckpt::checkpoint(f, x) : f(x)).pow(2).sum();
    ckpt::GraphExecGroup group;
    const auto gradient = torch::autograd::grad({loss}, {x}, {}, true, true)[0];
    (loss + gradient.pow(2).sum()).backward();
    auto grads = take_grads(*block);
    grads.push_back(x.grad().clone());
    return grads;
  };
  const auto plain = penalised_step(false);
  const auto grouped = penalised_step(true);
  EXPECT_EQ(recomputes, 1);
  ASSERT_EQ(plain.size(), grouped.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_TRUE(bit_equal(plain[i].cpu(), grouped[i].cpu())) << i;
  }
}

CKPT_INSTANTIATE_DEVICE_SUITE(RecomputeThreadTest);

}  // namespace recompute_thread_test
