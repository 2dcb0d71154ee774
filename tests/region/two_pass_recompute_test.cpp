// Issue 48, item 3 (recompute at operator granularity): a backward's recompute in two passes
// (`CheckpointOptions::two_pass_recompute`). The backward never holds what the function's first
// operators saved beside what its last ones saved, and its gradients, buffers and random state
// are the plain step's, to the bit. A function that saves other tensors the second time, or
// writes a saved tensor in place, is an error.

#include <ckpt/ckpt.h>

#include "support/support.h"

#include <cmath>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace two_pass_recompute_test {

using ckpt::test::bit_equal;
using ckpt::test::take_grads;

ckpt::CheckpointOptions two_passes() {
  return ckpt::CheckpointOptions().two_pass_recompute(true);
}

// A pre-LayerNorm attention half, as the bench transformer's: its backward peaks in the softmax,
// while the projections' inputs (saved first) wait for their own backward.
struct Attention : torch::nn::Module {
  static constexpr int64_t kWidth = 64, kHeads = 4;
  torch::nn::LayerNorm norm{
      register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kWidth})))};
  torch::nn::Linear qkv{register_module("qkv", torch::nn::Linear(kWidth, 3 * kWidth))};
  torch::nn::Linear out{register_module("out", torch::nn::Linear(kWidth, kWidth))};
  torch::nn::Dropout dropout{register_module("dropout", torch::nn::Dropout(0.1))};

  at::Tensor forward(const at::Tensor& x) {
    const int64_t b = x.size(0), s = x.size(1), dh = kWidth / kHeads;
    const at::Tensor t = qkv(norm(x)).view({b, s, 3, kHeads, dh}).permute({2, 0, 3, 1, 4});
    const at::Tensor scores =
        torch::matmul(t[0], t[1].transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(dh)));
    const at::Tensor probs = dropout(torch::softmax(scores, -1));
    return x + out(torch::matmul(probs, t[2]).transpose(1, 2).reshape({b, s, kWidth}));
  }
};

struct Step {
  at::Tensor out, input_grad, random_after;
  std::vector<at::Tensor> grads;
  int64_t backward_peak = 0;  // above what the step held before its backward
};

Step run_step(const std::shared_ptr<Attention>& model, const at::Tensor& input,
              const std::optional<ckpt::CheckpointOptions>& options) {
  torch::manual_seed(11);
  Step step;
  const at::Tensor x = input.detach().requires_grad_();
  ckpt::MemoryTracker tracker(torch::kCPU, ckpt::MemoryScope::CallingThread);
  step.out = options ? ckpt::checkpoint(*options, model, x) : model->forward(x);
  const at::Tensor loss = step.out.pow(2).sum();
  const int64_t before = tracker.current_bytes();
  tracker.reset_peak();
  loss.backward();
  step.backward_peak = tracker.peak_bytes() - before;
  step.input_grad = x.grad().clone();
  step.random_after = torch::rand({3});
  step.grads = take_grads(*model);
  return step;
}

void expect_same(const Step& plain, const Step& step) {
  EXPECT_TRUE(bit_equal(plain.out, step.out));
  EXPECT_TRUE(bit_equal(plain.input_grad, step.input_grad));
  EXPECT_TRUE(bit_equal(plain.random_after, step.random_after));
  ASSERT_EQ(plain.grads.size(), step.grads.size());
  for (size_t i = 0; i < plain.grads.size(); ++i) {
    EXPECT_TRUE(bit_equal(plain.grads[i], step.grads[i])) << "parameter " << i;
  }
}

// `run(checkpointed)` gives what a step leaves (gradients, buffers, random draws after it): two
// steps in two passes (the first sizes the call site's function) against the plain step, to the
// bit.
void expect_plain_bits(const std::function<std::vector<at::Tensor>(bool checkpointed)>& run) {
  const auto plain = run(false);
  for (int step = 0; step < 2; ++step) {
    SCOPED_TRACE(step);
    const auto two = run(true);
    ASSERT_EQ(plain.size(), two.size());
    for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(bit_equal(plain[i], two[i])) << i;
  }
}

TEST(TwoPassRecomputeTest, AttentionsBackwardHoldsLessAndGivesThePlainGradients) {
  auto model = std::make_shared<Attention>();
  const at::Tensor input = torch::randn({2, 128, Attention::kWidth});
  const Step plain = run_step(model, input, std::nullopt);
  const Step one_pass = run_step(model, input, ckpt::CheckpointOptions());
  expect_same(plain, one_pass);
  // The first recompute at the call site learns where the head ends (it lets go of the head's
  // tensors once it has run); later ones let go of them as they are saved.
  for (int step = 0; step < 2; ++step) {
    SCOPED_TRACE(step);
    const Step two = run_step(model, input, two_passes());
    expect_same(plain, two);
    // The head: the LayerNorm's output and the copies of q and k the first matmul saved.
    const int64_t head_bytes = 3 * input.numel() * static_cast<int64_t>(sizeof(float));
    EXPECT_LE(two.backward_peak + head_bytes, one_pass.backward_peak)
        << two.backward_peak << " against one pass's " << one_pass.backward_peak;
  }
}

TEST(TwoPassRecomputeTest, BatchNormStatisticsAreUpdatedOnce) {
  torch::nn::Sequential model(torch::nn::Linear(8, 16), torch::nn::BatchNorm1d(16),
                              torch::nn::Tanh(), torch::nn::Linear(16, 16), torch::nn::Tanh(),
                              torch::nn::Linear(16, 4));
  const at::Tensor input = torch::randn({32, 8});
  auto run = [&](bool checkpointed) {
    auto copy = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(model->clone());
    const at::Tensor x = input.detach().requires_grad_();
    const at::Tensor y = checkpointed ? ckpt::checkpoint(two_passes(), copy, x) : copy->forward(x);
    y.pow(2).sum().backward();
    std::vector<at::Tensor> seen = take_grads(*copy);
    seen.push_back(x.grad());
    for (const auto& buffer : copy->buffers()) seen.push_back(buffer.clone());
    return seen;
  };
  expect_plain_bits(run);
}

// Differentiated again (a gradient penalty) or kept for later backward passes, the recomputed
// graph holds all it saved anyway: one pass, the gradients of one pass.
TEST(TwoPassRecomputeTest, DoubleBackwardGivesTheGradientsOfOnePass) {
  auto model = std::make_shared<Attention>();
  model->eval();  // no dropout: the penalty's two backward passes draw nothing
  const at::Tensor input = torch::randn({2, 16, Attention::kWidth});
  auto penalty = [&](const ckpt::CheckpointOptions& options) {
    const at::Tensor x = input.detach().requires_grad_();
    const at::Tensor y = ckpt::checkpoint(options, model, x);
    const at::Tensor g = torch::autograd::grad({y.pow(2).sum()}, {x}, {}, true, true)[0];
    g.pow(2).sum().backward();
    std::vector<at::Tensor> seen = take_grads(*model);
    seen.push_back(x.grad());
    return seen;
  };
  const auto one = penalty(ckpt::CheckpointOptions());
  const auto two = penalty(two_passes());
  for (size_t i = 0; i < one.size(); ++i) EXPECT_TRUE(bit_equal(one[i], two[i])) << i;
}

// Several backward passes through one region (retain_graph): outside a group each recomputes in
// two passes (none of them lets go of the arguments but the last); in a group the kept graph is
// recomputed once, in one pass.
TEST(TwoPassRecomputeTest, SeveralBackwardPassesGiveThePlainGradients) {
  auto model = std::make_shared<Attention>();
  model->eval();
  const at::Tensor input = torch::randn({2, 16, Attention::kWidth});
  auto run = [&](bool checkpointed, bool grouped) {
    const at::Tensor x = input.detach().requires_grad_();
    const at::Tensor out =
        checkpointed ? ckpt::checkpoint(two_passes(), model, x) : model->forward(x);
    std::optional<ckpt::GraphExecGroup> group;
    if (grouped) group.emplace();
    for (int i = 0; i < 3; ++i) out.pow(i + 1).sum().backward({}, /*retain_graph=*/i < 2);
    std::vector<at::Tensor> seen = take_grads(*model);
    seen.push_back(x.grad());
    return seen;
  };
  const auto plain = run(false, false);
  for (const bool grouped : {false, true}) {
    SCOPED_TRACE(grouped);
    const auto two = run(true, grouped);
    for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(bit_equal(plain[i], two[i])) << i;
  }
}

// Regions inside run again in each pass, and their own recomputes run in their backward.
TEST(TwoPassRecomputeTest, NestedRegionsGiveThePlainGradients) {
  auto inner = std::make_shared<Attention>();
  auto outer = std::make_shared<Attention>();
  const at::Tensor input = torch::randn({2, 32, Attention::kWidth});
  auto run = [&](bool checkpointed) {
    torch::manual_seed(5);
    const at::Tensor x = input.detach().requires_grad_();
    auto both = [&](const at::Tensor& in) {
      const at::Tensor h = checkpointed ? ckpt::checkpoint(two_passes(), inner, in.tanh())
                                        : inner->forward(in.tanh());
      return outer->forward(h.sin());
    };
    const at::Tensor y = checkpointed ? ckpt::checkpoint(two_passes(), both, x) : both(x);
    y.pow(2).sum().backward();
    std::vector<at::Tensor> seen = take_grads(*inner);
    for (const auto& g : take_grads(*outer)) seen.push_back(g);
    seen.push_back(x.grad());
    seen.push_back(torch::rand({2}));
    return seen;
  };
  expect_plain_bits(run);
}

// Sizes that follow from values (masked_select) and a value read in C++ (data_ptr) in the head:
// both passes compute every value, so both see the forward's.
TEST(TwoPassRecomputeTest, ValuesReadInTheHeadAreTheSameInBothPasses) {
  torch::nn::Linear first(32, 32), second(32, 32);
  auto fn = [&](const at::Tensor& x) {
    at::Tensor h = first(x);
    if (h.contiguous().data_ptr<float>()[0] > 0) h = h * 2;
    const at::Tensor picked = h.masked_select(h > 0).sin();  // sin saves its argument
    return second(torch::tanh(h)).sum() + picked.exp().sum() + torch::dropout(h, 0.5, true).sum();
  };
  const at::Tensor input = torch::randn({64, 32});
  auto run = [&](bool checkpointed) {
    torch::manual_seed(3);
    const at::Tensor x = input.detach().requires_grad_();
    (checkpointed ? ckpt::checkpoint(two_passes(), fn, x) : fn(x)).backward();
    std::vector<at::Tensor> seen = take_grads(*first);
    for (const auto& g : take_grads(*second)) seen.push_back(g);
    seen.push_back(x.grad());
    return seen;
  };
  expect_plain_bits(run);
}

// Steps on two threads at once through one call site (each its own model): each backward's
// passes are its own, and the call site's learned head is shared.
TEST(TwoPassRecomputeTest, StepsOnTwoThreadsGiveThePlainGradients) {
  const at::Tensor input = torch::randn({2, 32, Attention::kWidth});
  auto step = [&](const std::shared_ptr<Attention>& model, bool checkpointed) {
    const at::Tensor x = input.detach().requires_grad_();
    const at::Tensor y =
        checkpointed ? ckpt::checkpoint(two_passes(), model, x) : model->forward(x);
    y.pow(2).sum().backward();
    std::vector<at::Tensor> seen = take_grads(*model);
    seen.push_back(x.grad());
    return seen;
  };
  std::vector<std::shared_ptr<Attention>> models{std::make_shared<Attention>(),
                                                 std::make_shared<Attention>()};
  std::vector<std::vector<at::Tensor>> plain, two(2);
  for (auto& model : models) {
    model->eval();  // no dropout: the threads' draws would interleave
    plain.push_back(step(model, false));
  }
  for (int round = 0; round < 3; ++round) {
    std::vector<std::thread> threads;
    for (size_t t = 0; t < models.size(); ++t)
      threads.emplace_back([&, t] { two[t] = step(models[t], true); });
    for (auto& thread : threads) thread.join();
    for (size_t t = 0; t < models.size(); ++t) {
      for (size_t i = 0; i < plain[t].size(); ++i)
        EXPECT_TRUE(bit_equal(plain[t][i], two[t][i])) << "thread " << t << ", " << i;
    }
  }
}

// Its first operator's saved tensor (the head) has other strides when the function runs a fourth
// time: after the forward, the call site's sizing run and the first pass, in the second pass.
TEST(TwoPassRecomputeTest, AFunctionThatSavesOtherTensorsTheSecondTimeIsAnError) {
  int calls = 0;
  auto fn = [&calls](const at::Tensor& x) {
    ++calls;
    const at::Tensor source = calls == 4 ? x.t().contiguous().t() : x;
    const at::Tensor a = (source * 2).sin();  // sin saves its argument: the head
    const at::Tensor b = a.exp();             // exp saves its result
    return b.exp().cos();
  };
  const at::Tensor x = torch::randn({16, 16}).requires_grad_();
  const at::Tensor y = ckpt::checkpoint(two_passes(), fn, x);
  const bool grad_mode = at::GradMode::is_enabled();
  try {
    y.sum().backward();
    ADD_FAILURE() << "no error";
  } catch (const c10::Error& error) {
    EXPECT_NE(std::string(error.what())
                  .find("saved another tensor for the backward when it ran again (tensor #0"),
              std::string::npos)
        << error.what();
  }
  EXPECT_EQ(calls, 4);
  EXPECT_EQ(at::GradMode::is_enabled(), grad_mode);
}

// A tensor the first operators saved, written in place afterwards: autograd's error, as without
// the second pass.
TEST(TwoPassRecomputeTest, ASavedTensorWrittenInPlaceIsAutogradsError) {
  auto fn = [](const at::Tensor& x) {
    at::Tensor a = x * 2;
    const at::Tensor b = a.sin();  // saves a
    const at::Tensor c = b.exp().exp();
    a.mul_(3);
    return c.cos() + a;
  };
  for (const bool checkpointed : {false, true}) {
    SCOPED_TRACE(checkpointed);
    const at::Tensor x = torch::randn({16, 16}).requires_grad_();
    const at::Tensor y = checkpointed ? ckpt::checkpoint(two_passes(), fn, x) : fn(x);
    try {
      y.sum().backward();
      ADD_FAILURE() << "no error";
    } catch (const c10::Error& error) {
      EXPECT_NE(std::string(error.what()).find("modified by an inplace operation"),
                std::string::npos)
          << error.what();
    }
  }
}

}  // namespace two_pass_recompute_test
