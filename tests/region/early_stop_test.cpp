// Issue 33, item 1: early stop. A recompute runs the kernels of only the operators whose outputs
// the backward reads, learned at each call site from its first recompute; gradients, RNG and
// buffers end as after a full recompute. Issue 45, items 1, 2 and 9: it is off by default, since
// functions exist for which it can't be sound (the last tests here).

#include <ckpt/ckpt.h>

#include "support/counted_scale.h"
#include "support/support.h"

#include <atomic>
#include <cmath>
#include <functional>
#include <memory>
#include <vector>

namespace early_stop_test {

using ckpt::test::bit_equal;
using ckpt::test::take_grads;

// y = 2x by an operator whose formula saves nothing, so the backward never reads y.
using ckpt::test::counted_scale;
using ckpt::test::scale_kernel_calls;

ckpt::CheckpointOptions early(ckpt::CheckpointOptions options = {}) {
  return options.early_stop(true);
}

// Linear, BatchNorm (training), then a tail the backward does not read: the doubling (its
// formula saves nothing), a random draw, and a sum with no saved tensors.
struct Tail : torch::nn::Module {
  Tail()
      : linear(register_module("linear", torch::nn::Linear(6, 5))),
        norm(register_module("norm", torch::nn::BatchNorm1d(5))) {}
  at::Tensor forward(const at::Tensor& x) {
    const at::Tensor y = norm(linear(x)).sin();
    return counted_scale(y) + torch::rand({5});
  }
  torch::nn::Linear linear;
  torch::nn::BatchNorm1d norm;
};

struct Step {
  at::Tensor out, input_grad, random_after, mean, var;
  std::vector<at::Tensor> grads;
  int kernel_calls = 0;
};

Step run_step(const std::shared_ptr<Tail>& model, const at::Tensor& input, bool checkpointed,
              const ckpt::CheckpointOptions& options = {}) {
  torch::manual_seed(7);
  scale_kernel_calls = 0;
  Step step;
  const at::Tensor x = input.detach().requires_grad_();
  step.out = checkpointed ? ckpt::checkpoint(options, model, x) : model->forward(x);
  step.out.pow(2).sum().backward();
  step.input_grad = x.grad().clone();
  step.random_after = torch::rand({3});
  step.mean = model->norm->running_mean.clone();
  step.var = model->norm->running_var.clone();
  step.grads = take_grads(*model);
  step.kernel_calls = scale_kernel_calls.load();
  return step;
}

void expect_same(const Step& a, const Step& b) {
  EXPECT_TRUE(bit_equal(a.out, b.out));
  EXPECT_TRUE(bit_equal(a.input_grad, b.input_grad));
  EXPECT_TRUE(bit_equal(a.random_after, b.random_after));
  EXPECT_TRUE(bit_equal(a.mean, b.mean));
  EXPECT_TRUE(bit_equal(a.var, b.var));
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t i = 0; i < a.grads.size(); ++i) EXPECT_TRUE(bit_equal(a.grads[i], b.grads[i])) << i;
}

// Plain steps and checkpointed steps on the same model from the same buffers, in turn.
struct EarlyStopTest : ckpt::test::SeedingFixture {
  std::shared_ptr<Tail> model = std::make_shared<Tail>();
  at::Tensor input = torch::randn({4, 6});
  at::Tensor mean0 = model->norm->running_mean.clone(), var0 = model->norm->running_var.clone();

  Step step(bool checkpointed, const ckpt::CheckpointOptions& options = {}) {
    torch::NoGradGuard no_grad;
    model->norm->running_mean.copy_(mean0);
    model->norm->running_var.copy_(var0);
    torch::AutoGradMode grad(true);
    return run_step(model, input, checkpointed, options);
  }
};

// The first recompute at a call site runs in full and learns; the next ones skip the doubling.
// Everything else (the random draw, BatchNorm's update) runs, and every result is the plain
// step's.
TEST_F(EarlyStopTest, SkipsTheKernelsWhoseOutputsTheBackwardDoesNotRead) {
  const Step plain = step(false);
  EXPECT_EQ(plain.kernel_calls, 1);
  for (int run = 0; run < 3; ++run) {
    SCOPED_TRACE(run);
    const Step checkpointed = step(true, early());
    EXPECT_EQ(checkpointed.kernel_calls, run == 0 ? 2 : 1);
    expect_same(checkpointed, plain);
  }
}

// Off by default; on per region, or for every region with the process-wide switch.
TEST_F(EarlyStopTest, TheOptionAndTheGlobalSwitchTurnItOnAndOff) {
  const Step plain = step(false);
  for (int run = 0; run < 2; ++run) {
    const Step off = step(true);
    EXPECT_EQ(off.kernel_calls, 2);
    expect_same(off, plain);
  }
  {
    ckpt::CheckpointEarlyStopGuard full(false);
    EXPECT_EQ(ckpt::checkpoint_early_stop(), std::optional<bool>(false));
    for (int run = 0; run < 2; ++run) EXPECT_EQ(step(true, early()).kernel_calls, 2);
  }
  EXPECT_EQ(ckpt::checkpoint_early_stop(), std::nullopt);
  // The override wins over the option, as in PyTorch.
  ckpt::CheckpointEarlyStopGuard on(true);
  step(true);
  EXPECT_EQ(step(true).kernel_calls, 1);
}

// Without preserve_rng_state the recompute draws from the live generator: the random draw the
// backward does not read still runs, so the stream after the step is a full recompute's.
TEST_F(EarlyStopTest, RandomOperatorsAlwaysRun) {
  const auto no_stash = ckpt::CheckpointOptions().preserve_rng_state(false);
  const Step full = step(true, ckpt::CheckpointOptions(no_stash).early_stop(false));
  for (int run = 0; run < 3; ++run) {
    SCOPED_TRACE(run);
    const Step early = step(true, ckpt::CheckpointOptions(no_stash).early_stop(true));
    EXPECT_EQ(early.kernel_calls, run == 0 ? 2 : 1);
    expect_same(early, full);
  }
}

// An output the backward reads (sin saves its input) is computed in every recompute.
TEST(EarlyStop, AnOutputTheBackwardReadsIsRecomputed) {
  const at::Tensor input = torch::randn({3, 4});
  auto f = [](const at::Tensor& x) { return counted_scale(x.cos()).sin(); };
  const at::Tensor x0 = input.detach().requires_grad_();
  f(x0).sum().backward();
  for (int run = 0; run < 3; ++run) {
    scale_kernel_calls = 0;
    const at::Tensor x = input.detach().requires_grad_();
    ckpt::checkpoint(early(), f, x).sum().backward();
    EXPECT_EQ(scale_kernel_calls.load(), 2);
    EXPECT_TRUE(bit_equal(x.grad(), x0.grad()));
  }
}

// Inputs of another shape: the plan does not fit, the recompute runs those calls and learns again.
TEST(EarlyStop, AnotherShapeRunsInFullAndLearnsAgain) {
  auto f = [](const at::Tensor& x) { return counted_scale(x.tanh()) + x; };
  for (int64_t rows : {3, 3, 5, 5, 3}) {
    SCOPED_TRACE(rows);
    const at::Tensor input = torch::randn({rows, 4});
    const at::Tensor x0 = input.detach().requires_grad_();
    f(x0).exp().sum().backward();
    const at::Tensor x = input.detach().requires_grad_();
    ckpt::checkpoint(early(), f, x).exp().sum().backward();
    EXPECT_TRUE(bit_equal(x.grad(), x0.grad()));
  }
}

// The safety net: a function that, from its third call on, keeps its doubled output somewhere.
// The plan (learned when nothing kept it) skips the doubling; the stand-in it kept is still alive
// once the recompute's outputs are dropped, so the recompute runs again in full, and the call
// site skips nothing from then on. (The stand-in itself went where the function put it: code
// with side effects should check ckpt::is_recomputing().)
TEST(EarlyStop, ARecomputeThatKeepsASkippedOutputRunsAgainInFull) {
  std::vector<at::Tensor> kept;
  int calls = 0;
  auto f = [&](const at::Tensor& x) {
    at::Tensor y = counted_scale(x.sin());
    if (++calls >= 3) kept.push_back(y.detach());
    return y * 3;
  };
  const at::Tensor input = torch::randn({2, 5});
  const at::Tensor expected = input.sin() * 2;
  const at::Tensor x0 = input.detach().requires_grad_();
  (counted_scale(x0.sin()) * 3).sum().backward();
  for (int run = 0; run < 3; ++run) {
    SCOPED_TRACE(run);
    scale_kernel_calls = 0;
    kept.clear();
    const int calls_before = calls;
    const at::Tensor x = input.detach().requires_grad_();
    ckpt::checkpoint(early(), f, x).sum().backward();
    EXPECT_TRUE(bit_equal(x.grad(), x0.grad()));
    // run 0: forward, learning recompute; run 1: forward, the plan's recompute (its stand-in is
    // kept), the full one; run 2: forward, a full recompute.
    EXPECT_EQ(calls - calls_before, run == 1 ? 3 : 2);
    EXPECT_EQ(scale_kernel_calls.load(), 2);
    if (run == 0) continue;  // nothing kept yet
    ASSERT_FALSE(kept.empty());
    EXPECT_TRUE(bit_equal(kept.back(), expected));
    if (run == 2) {
      for (const at::Tensor& t : kept) EXPECT_TRUE(bit_equal(t, expected));
    }
  }
}

// Nested regions and a selective policy: each region learns its own plan.
TEST(EarlyStop, NestedAndSelectiveRegionsGiveThePlainGradients) {
  auto linear = torch::nn::Linear(4, 4);
  auto inner = [&](const at::Tensor& x) { return counted_scale(linear(x).relu()); };
  auto outer = [&](const at::Tensor& x) {
    return counted_scale(ckpt::checkpoint(early(), inner, x.sin()) + 1);
  };
  const at::Tensor input = torch::randn({3, 4});
  const at::Tensor x0 = input.detach().requires_grad_();
  outer(x0).sum().backward();
  const auto plain = take_grads(*linear);
  for (const bool selective : {false, true}) {
    for (int run = 0; run < 3; ++run) {
      SCOPED_TRACE(std::to_string(selective) + " " + std::to_string(run));
      const at::Tensor x = input.detach().requires_grad_();
      const auto options = selective ? early().policy(ckpt::save_matmuls()) : early();
      ckpt::checkpoint(options, outer, x).sum().backward();
      EXPECT_TRUE(bit_equal(x.grad(), x0.grad()));
      const auto grads = take_grads(*linear);
      for (size_t i = 0; i < grads.size(); ++i) EXPECT_TRUE(bit_equal(grads[i], plain[i])) << i;
    }
  }
}

// What early stop can't be sound for (issue 45, items 1, 2 and 9), under the default options:
// every step's gradients equal the plain step's. With early stop on, each of these gave other
// gradients or an error from the second step on.

// A loss of `fn` on `input`, with and without the default region: x.grad must be the same bits.
template <class Fn>
void expect_plain_gradients(const Fn& fn, const at::Tensor& input) {
  const at::Tensor x0 = input.detach().requires_grad_();
  fn(x0).sum().backward();
  const at::Tensor x = input.detach().requires_grad_();
  ckpt::checkpoint(fn, x).sum().backward();
  EXPECT_TRUE(bit_equal(x.grad(), x0.grad()));
}

// Item 1: outputs whose shapes depend on values, and a non-tensor argument that changes.
TEST(EarlyStopDefault, OutputsWhoseShapesDependOnValues) {
  torch::nn::Linear lin(4, 4);
  for (const int64_t positives : {40, 30, 50, 30}) {
    SCOPED_TRACE(positives);
    at::Tensor input = -torch::rand({64});
    input.narrow(0, 0, positives).neg_();
    expect_plain_gradients([](const at::Tensor& t) { return t.masked_select(t > 0).mean(); },
                           input);
    const at::Tensor rows = input.view({16, 4});
    expect_plain_gradients(
        [&](const at::Tensor& t) { return lin(t).index({t.select(1, 0) > 0}).mean(); }, rows);
    const int64_t pad = positives / 10;
    expect_plain_gradients(
        [pad](const at::Tensor& t) {
          return at::constant_pad_nd(t.exp(), {pad, pad}) * 2;
        },
        input);
  }
}

// Item 2: a custom operator that computes through data_ptr, as C++ extension code often does, and
// saves its output; and a branch on a value read the same way.
class RawExp : public torch::autograd::Function<RawExp> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x) {
    const at::Tensor in = x.contiguous();
    at::Tensor out = at::empty(in.sizes(), in.options());  // reads no data through the dispatcher
    const float* from = in.data_ptr<float>();
    float* to = out.data_ptr<float>();
    for (int64_t i = 0; i < in.numel(); ++i) to[i] = std::exp(from[i]);
    ctx->save_for_backward({out});
    return out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    return {grads[0] * ctx->get_saved_variables()[0]};
  }
};

TEST(EarlyStopDefault, CodeThatReadsMemoryDirectly) {
  torch::nn::Linear lin(5, 5);
  // The product by 2 saves nothing, so nothing the backward reads comes from it but what RawExp
  // computes from it, out of the dispatcher's sight.
  auto fn = [&](const at::Tensor& t) {
    const at::Tensor h = lin(t).tanh() * 2;
    const at::Tensor e = RawExp::apply(h);
    return h.data_ptr<float>()[0] > 0 ? e * 2 : e.sin();
  };
  for (int step = 0; step < 4; ++step) {
    SCOPED_TRACE(step);
    expect_plain_gradients(fn, torch::randn({3, 5}));
  }
}

// Item 9: one helper that checkpoints whichever function it is given, at one call site, as a
// model's code often has it (`run_block(options, f, x)`), here also with a selective policy.
at::Tensor run_block(const ckpt::CheckpointOptions& options,
                     const std::function<at::Tensor(const at::Tensor&)>& fn, const at::Tensor& x) {
  return ckpt::checkpoint(options, fn, x);
}

TEST(EarlyStopDefault, OneHelperForSeveralFunctions) {
  torch::nn::Linear first_linear(4, 4), second_linear(4, 4);
  const std::function<at::Tensor(const at::Tensor&)> first = [&](const at::Tensor& t) {
    return counted_scale(first_linear(t).relu()).cos();
  };
  const std::function<at::Tensor(const at::Tensor&)> second = [&](const at::Tensor& t) {
    return second_linear(t.exp()).tanh() * t;
  };
  const at::Tensor input = torch::randn({3, 4});
  const at::Tensor x0 = input.detach().requires_grad_();
  second(first(x0)).sum().backward();
  const auto plain = take_grads(*first_linear);
  const auto must_save_products = ckpt::SelectivePolicy([](const ckpt::OpCall& call) {
    return call.name() == "aten::addmm" ? ckpt::CheckpointPolicy::MustSave
                                        : ckpt::CheckpointPolicy::PreferRecompute;
  });
  for (const auto& options :
       {ckpt::CheckpointOptions(), ckpt::CheckpointOptions().policy(ckpt::save_matmuls()),
        ckpt::CheckpointOptions().policy(must_save_products)}) {
    for (int step = 0; step < 3; ++step) {
      SCOPED_TRACE(step);
      const at::Tensor x = input.detach().requires_grad_();
      run_block(options, second, run_block(options, first, x)).sum().backward();
      EXPECT_TRUE(bit_equal(x.grad(), x0.grad()));
      const auto grads = take_grads(*first_linear);
      for (size_t i = 0; i < grads.size(); ++i) EXPECT_TRUE(bit_equal(grads[i], plain[i])) << i;
    }
  }
}

}  // namespace early_stop_test
