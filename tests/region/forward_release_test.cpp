// A region's forward lets go of its graph's saved tensors as it goes, as PyTorch's pack hooks
// drop them, with or without a selective policy: it holds what a forward without autograd holds.
// Where the call needs that graph after all (a backward inside the function, an intermediate
// stored outside the region, a write into an argument after something was let go of), the region
// runs the function again keeping it, from the same random state and buffers.

#include <ckpt/ckpt.h>
#include <ckpt/memory_tracker.h>

#include "support/support.h"

#include <string>
#include <vector>

namespace forward_release_test {

using ckpt::test::bit_equal;
using ckpt::test::take_grads;

std::vector<ckpt::CheckpointOptions> both_variants() {
  return {ckpt::CheckpointOptions(), ckpt::CheckpointOptions().policy(ckpt::save_matmuls())};
}

std::string variant_name(const ckpt::CheckpointOptions& options) {
  return options.policy() ? "selective" : "checkpointed";
}

// Four 1 MiB intermediates that autograd saves; each statement's temporaries die with it.
at::Tensor chain_of_four(const at::Tensor& x) {
  at::Tensor h = x.tanh();
  h = h.sigmoid();
  h = h.exp();
  h = h.tanh();
  return h.sum();
}

// The peak of `forward` above what lived before it, with and without autograd (a tracker each).
struct ForwardPeaks {
  ckpt::MemoryTracker tracker;
  template <class Forward>
  int64_t of(const Forward& forward) {
    const int64_t before = tracker.current_bytes();
    tracker.reset_peak();
    const at::Tensor out = forward();
    return tracker.peak_bytes() - before;
  }
  template <class Forward>
  int64_t without_autograd(const Forward& forward) {
    return of([&] {
      torch::NoGradGuard no_grad;
      return forward();
    });
  }
};

const int64_t megabyte = 1 << 20;

// The forward's peak above what it started with is the forward's without autograd: before, the
// region held the whole graph, saved tensors and all, until its function returned (2 MiB more).
TEST(ForwardReleaseTest, AForwardPeaksAsOneWithoutAutograd) {
  ForwardPeaks peaks;
  const auto x = torch::randn({256, 1024}, torch::requires_grad());
  const int64_t without_autograd = peaks.without_autograd([&] { return chain_of_four(x); });
  EXPECT_GE(peaks.of([&] { return chain_of_four(x); }), without_autograd + 2 * megabyte);
  for (const auto& options : both_variants()) {
    SCOPED_TRACE(variant_name(options));
    const int64_t checkpointed =
        peaks.of([&] { return ckpt::checkpoint(options, chain_of_four, x); });
    // The RNG stash and the region's bookkeeping: some KB.
    EXPECT_LT(checkpointed, without_autograd + megabyte / 8);
  }
}

// A module with a buffer its forward only reads (a mask, a positional table): 1 MiB.
struct Masked : torch::nn::Module {
  Masked() : mask(register_buffer("mask", torch::rand({256, 1024}))) {}
  at::Tensor forward(const at::Tensor& t) { return chain_of_four(t * mask); }
  at::Tensor mask;
};

// A forward that lets go of its graph keeps a copy of each buffer it writes, for a second run,
// taken just before the write: a buffer it only reads costs nothing (before, every buffer was
// copied as the forward began: 1 MiB more here). BatchNorm's statistics, which it writes, are put
// back by the second run (AnIntermediateStoredOutsideRunsTheFunctionAgainOnce). The first call at
// a call site copies every buffer for its recompute, to learn which ones the function writes.
TEST(ForwardReleaseTest, ABufferTheFunctionOnlyReadsIsNotCopied) {
  ForwardPeaks peaks;
  auto module = std::make_shared<Masked>();
  const auto x = torch::randn({256, 1024}, torch::requires_grad());
  const int64_t without_autograd = peaks.without_autograd([&] { return module->forward(x); });
  for (const auto& options : both_variants()) {
    SCOPED_TRACE(variant_name(options));
    const auto call = [&] { return ckpt::checkpoint(options, module, x); };
    peaks.of(call);  // the call site's first call: it learns which buffers the function writes
    EXPECT_LT(peaks.of(call), without_autograd + megabyte / 8);
  }
}

// Keeps an intermediate for a loss of its own, outside the region's results.
struct Stashing : torch::nn::Module {
  Stashing()
      : norm(register_module("norm", torch::nn::BatchNorm1d(3))),
        dropout(register_module("dropout", torch::nn::Dropout(0.5))),
        linear(register_module("linear", torch::nn::Linear(3, 3))) {}
  at::Tensor forward(const at::Tensor& t) {
    ++calls;
    stashed = dropout(norm(t)).tanh();
    return linear(stashed.pow(3)).sigmoid();
  }
  torch::nn::BatchNorm1d norm;
  torch::nn::Dropout dropout;
  torch::nn::Linear linear;
  at::Tensor stashed;
  int calls = 0;
};

// A backward through an intermediate that the function stored outside the region would reach
// nodes whose saved tensors the forward let go of (autograd's error, in the step's backward): the
// region finds the stored tensor holding them as the function returns, and runs the function
// again keeping its graph, from the same random state and buffers, as it does at that call site
// from then on. Values, the random stream and BatchNorm's statistics are those of one plain run;
// the gradients too, up to the order in which the two paths' sums arrive.
TEST(ForwardReleaseTest, AnIntermediateStoredOutsideRunsTheFunctionAgainOnce) {
  for (const auto& options : both_variants()) {
    SCOPED_TRACE(variant_name(options));
    auto module = std::make_shared<Stashing>();
    const auto input = torch::randn({4, 3});
    const auto buffers = ckpt::test::copy_buffers(*module);
    auto step = [&](bool checkpointed) {
      ckpt::test::restore_buffers(*module, buffers);
      module->calls = 0;
      torch::manual_seed(3);
      auto x = input.detach().requires_grad_();
      const at::Tensor out =
          checkpointed ? ckpt::checkpoint(options, module, x) : module->forward(x);
      const at::Tensor loss = out.sum() + module->stashed.square().sum();
      const auto grads = torch::autograd::grad({loss}, {x, module->linear->weight});
      return std::vector<at::Tensor>{out,
                                     torch::rand({2}),
                                     module->norm->running_mean.clone(),
                                     module->norm->running_var.clone(),
                                     grads[0],
                                     grads[1]};
    };
    const auto plain = step(false);
    for (int run = 0; run < 2; ++run) {
      SCOPED_TRACE("run " + std::to_string(run));
      const auto checkpointed = step(true);
      // The forward twice at the first call, once at the next; the backward's recompute once.
      EXPECT_EQ(module->calls, run == 0 ? 3 : 2);
      for (size_t i = 0; i < 4; ++i) EXPECT_TRUE(bit_equal(checkpointed[i], plain[i])) << i;
      for (size_t i = 4; i < plain.size(); ++i)
        EXPECT_TRUE(torch::allclose(checkpointed[i], plain[i], 1e-6, 1e-7)) << i;
    }
  }
}

// Writes into its second argument after computing from the first: by then the forward let go of
// what the first operators saved.
struct WritesLate : torch::nn::Module {
  WritesLate()
      : first(register_module("first", torch::nn::Linear(8, 8))),
        second(register_module("second", torch::nn::Linear(8, 8))) {}
  at::Tensor forward(const at::Tensor& x, const at::Tensor& scale) {
    ++calls;
    const at::Tensor h = torch::dropout(first(x).tanh(), 0.25, true);
    scale.mul_(3);
    return second(h * scale).sigmoid();
  }
  torch::nn::Linear first, second;
  int calls = 0;
};

// The write into the argument would leave a call that keeps its graph (as a first call that
// writes into an argument does) with a graph whose saved tensors are gone: the forward stops
// before the write and the region runs the function again keeping its graph, so the argument is
// written once. Later calls copy the argument before the function and let go of their graphs.
TEST(ForwardReleaseTest, AWriteIntoAnArgumentAfterReleasesRunsTheFunctionAgain) {
  for (const auto& options : both_variants()) {
    SCOPED_TRACE(variant_name(options));
    auto module = std::make_shared<WritesLate>();
    const auto input = torch::randn({4, 8});
    auto step = [&](bool checkpointed) {
      module->calls = 0;
      torch::manual_seed(5);
      auto x = input.detach().requires_grad_();
      auto scale = torch::full({4, 8}, 0.5);
      const at::Tensor out =
          checkpointed ? ckpt::checkpoint(options, module, x, scale) : module->forward(x, scale);
      out.sum().backward();
      std::vector<at::Tensor> result{out, scale, x.grad(), torch::rand({2})};
      for (auto& grad : take_grads(*module)) result.push_back(grad);
      return result;
    };
    const auto plain = step(false);
    for (int run = 0; run < 2; ++run) {
      SCOPED_TRACE("run " + std::to_string(run));
      const auto checkpointed = step(true);
      // First call: stopped before the write, run again keeping its graph (no recompute). Next:
      // one forward from a copy of the argument, one recompute.
      EXPECT_EQ(module->calls, 2);
      ASSERT_EQ(checkpointed.size(), plain.size());
      for (size_t i = 0; i < plain.size(); ++i)
        EXPECT_TRUE(bit_equal(checkpointed[i], plain[i])) << i;
    }
  }
}

// A gradient penalty inside the function: its backward reaches nodes the forward let go of, and
// the region runs it again keeping them; without a policy as with one (selective_test.cpp).
struct Penalised : torch::nn::Module {
  Penalised() : linear(register_module("linear", torch::nn::Linear(3, 3))) {}
  at::Tensor forward(const at::Tensor& t) {
    ++calls;
    const at::Tensor y = linear(t).tanh().pow(3);
    const at::Tensor g = torch::autograd::grad({y.sum()}, {t}, {}, true, true)[0];
    return y.sum() + g.square().sum();
  }
  torch::nn::Linear linear;
  int calls = 0;
};

TEST(ForwardReleaseTest, ABackwardInsideTheFunctionRunsItAgainOnce) {
  auto module = std::make_shared<Penalised>();
  const auto input = torch::randn({4, 3});
  auto step = [&](bool checkpointed) {
    module->calls = 0;
    auto x = input.detach().requires_grad_();
    const at::Tensor out = checkpointed ? ckpt::checkpoint(module, x) : module->forward(x);
    return std::vector<at::Tensor>{out, torch::autograd::grad({out}, {x})[0]};
  };
  const auto plain = step(false);
  for (int run = 0; run < 2; ++run) {
    SCOPED_TRACE("run " + std::to_string(run));
    const auto checkpointed = step(true);
    EXPECT_EQ(module->calls, run == 0 ? 3 : 2);
    for (size_t i = 0; i < plain.size(); ++i)
      EXPECT_TRUE(bit_equal(checkpointed[i], plain[i])) << i;
  }
}

// A custom autograd function that saves its input and its result (its node is let go of with the
// rest of the region's graph).
struct CubeFunction : torch::autograd::Function<CubeFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* context, const at::Tensor& t) {
    const at::Tensor result = t * t * t;
    context->save_for_backward({t, result});
    return result;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* context,
                                                 torch::autograd::variable_list grads) {
    const auto saved = context->get_saved_variables();
    return {grads[0] * 3 * saved[1] / saved[0]};
  }
};

// What a hostile function does beside the dispatcher's sight: sizes that follow from values,
// a value read through a raw pointer after the operators that made it had their saved tensors let
// go of, a custom autograd function, and results that are views of one intermediate, the
// intermediate itself and an argument returned as it came. Its argument comes from a graph
// outside the region, which the release must not touch. Everything is the plain step's, to the bit.
std::vector<at::Tensor> hostile(torch::nn::Linear linear, const at::Tensor& x) {
  at::Tensor h = linear(x).tanh();
  const at::Tensor positive = h.masked_select(h > 0);  // its size follows from the values
  h = CubeFunction::apply(h + 1);
  const float first = h.contiguous().data_ptr<float>()[0];  // read after its producers let go
  const at::Tensor summed = positive.square().sum() * first + h.sigmoid().sum();
  return {summed, h.t(), h.select(0, 1), h, x};
}

TEST(ForwardReleaseTest, ValuesReadOutsideTheDispatcherAndOutputViewsGiveThePlainGradients) {
  for (const auto& options : both_variants()) {
    SCOPED_TRACE(variant_name(options));
    torch::manual_seed(11);
    torch::nn::Linear linear(6, 5);
    const auto input = torch::randn({4, 6});
    auto step = [&](bool checkpointed) {
      linear->zero_grad();
      auto leaf = input.detach().requires_grad_();
      const at::Tensor x = leaf * 2;  // made outside the region
      const std::vector<at::Tensor> outputs =
          checkpointed ? ckpt::checkpoint(options, hostile, linear, x) : hostile(linear, x);
      at::Tensor loss = outputs[0];
      for (size_t i = 1; i < outputs.size(); ++i)
        loss = loss + outputs[i].cos().sum() * static_cast<double>(i);
      loss.backward();
      std::vector<at::Tensor> result = outputs;
      result.push_back(leaf.grad());
      for (auto& grad : take_grads(*linear)) result.push_back(grad);
      return result;
    };
    const auto plain = step(false);
    for (int run = 0; run < 2; ++run) {
      SCOPED_TRACE("run " + std::to_string(run));
      const auto checkpointed = step(true);
      ASSERT_EQ(checkpointed.size(), plain.size());
      for (size_t i = 0; i < plain.size(); ++i)
        EXPECT_TRUE(bit_equal(checkpointed[i], plain[i])) << i;
    }
  }
}

}  // namespace forward_release_test
