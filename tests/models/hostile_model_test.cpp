// Hostile models for `PlannedModel`: candidates written as users may write them, run under random
// valid plans and compared with the plain step to the bit.

#include <ckpt/candidate.h>
#include <ckpt/memory_tracker.h>
#include <ckpt/model_profiler.h>
#include <ckpt/modules.h>
#include <ckpt/planned_model.h>

#include "support/forced_plan.h"
#include "support/support.h"

#include <functional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

namespace hostile_model_test {

using ckpt::test::bit_equal;
using LossFn = std::function<torch::Tensor()>;

struct Step {
  torch::Tensor loss;
  std::vector<torch::Tensor> grads, buffers;
};

// One step from no gradients and the buffers `start`.
Step step_of(torch::nn::Module& model, const LossFn& loss_fn,
             const std::vector<torch::Tensor>& start) {
  ckpt::test::restore_buffers(model, start);
  for (auto& p : model.parameters()) p.mutable_grad().reset();
  torch::manual_seed(7);
  Step step;
  step.loss = loss_fn();
  step.loss.backward();
  step.loss = step.loss.detach();
  step.grads = ckpt::test::take_grads(model);
  step.buffers = ckpt::test::copy_buffers(model);
  return step;
}

// To the bit, or (`close`) within float rounding, where a region sums the gradients its recompute
// sends to a border tensor before they meet its other uses (docs/limits.md, "Gradients summed in
// another order").
void expect_same(const Step& plain, const Step& planned, bool close) {
  EXPECT_TRUE(bit_equal(plain.loss, planned.loss));
  ASSERT_EQ(plain.buffers.size(), planned.buffers.size());
  for (size_t i = 0; i < plain.buffers.size(); ++i) {
    EXPECT_TRUE(bit_equal(plain.buffers[i], planned.buffers[i])) << "buffer " << i;
  }
  ASSERT_EQ(plain.grads.size(), planned.grads.size());
  for (size_t i = 0; i < plain.grads.size(); ++i) {
    if (close) {
      EXPECT_TRUE(torch::allclose(plain.grads[i], planned.grads[i], 1e-5, 1e-7))
          << "gradient " << i;
    } else {
      EXPECT_TRUE(bit_equal(plain.grads[i], planned.grads[i])) << "gradient " << i;
    }
  }
}

// Every random valid plan of `model`'s profile runs the plain step: its loss, gradients and
// buffers.
void expect_every_plan_is_the_plain_step(const std::shared_ptr<torch::nn::Module>& model,
                                         const LossFn& loss_fn, int plans, bool close = false) {
  const std::vector<torch::Tensor> start = ckpt::test::copy_buffers(*model);
  const Step plain = step_of(*model, loss_fn, start);
  // Every storage mode the CPU has, "two_pass" included.
  const ckpt::MeasuredModel measured = ckpt::profile_model(
      model, loss_fn, ckpt::ModelProfileOptions().storage_modes(ckpt::StorageModes::standard()));
  std::mt19937 random(11);
  for (int run = 0; run < plans;) {
    const std::vector<int> choice = ckpt::test::random_valid_choice(measured.profile, random);
    if (choice.empty()) continue;
    ckpt::PlannedModel planned(
        model, ckpt::Budget::bytes(2 * measured.profile.plain_peak_bytes()),
        ckpt::PlannedModelOptions().storage_modes(ckpt::StorageModes::standard()));
    planned.plan(ckpt::test::forced_choice(measured, choice));
    SCOPED_TRACE(planned.summary());
    for (int repeat = 0; repeat < 2; ++repeat) {
      expect_same(plain,
                  step_of(
                      *model, [&] { return planned.run(loss_fn); }, start),
                  close);
    }
    ++run;
  }
}

// A weight two candidates share (tied embeddings), a candidate that returns a view of its
// argument, one that returns its argument itself, one with two outputs (one random), an integer
// output a later candidate indexes with, and an output the loss reads besides its taker.
struct QuirkyImpl : torch::nn::Module {
  torch::Tensor tied;
  torch::nn::Linear mid{nullptr};
  torch::nn::Dropout drop{nullptr};

  QuirkyImpl() {
    tied = register_parameter("tied", torch::randn({96, 160}) * 0.2);
    mid = register_module("mid", torch::nn::Linear(160, 64));
    drop = register_module("drop", torch::nn::Dropout(0.25));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    auto h = ckpt::candidate(
        "embed", [this](const torch::Tensor& v) { return torch::tanh(v.mm(tied)); }, x);
    auto t = ckpt::candidate(
        "view", [](const torch::Tensor& v) { return v.t(); }, h);
    auto same = ckpt::candidate(
        "identity", [](const torch::Tensor& v) { return v; }, t);
    auto [a, b] = ckpt::candidate(
        "pair",
        [this](const torch::Tensor& v) {
          auto u = mid(v.t());
          return std::make_tuple(drop(torch::relu(u)), u.sigmoid());
        },
        same);
    auto index = ckpt::candidate(
        "argmax", [](const torch::Tensor& v) { return v.argmax(1, /*keepdim=*/true); }, b);
    auto picked = ckpt::candidate(
        "gather", [](const torch::Tensor& v, const torch::Tensor& i) { return v.gather(1, i) * v; },
        a, index);
    auto out = ckpt::candidate(
        "unembed", [this](const torch::Tensor& v) { return v.mm(tied.narrow(1, 0, 64).t()); },
        picked);
    return out.pow(2).mean() + h.sum() * 1e-3;
  }
};
TORCH_MODULE(Quirky);

TEST(HostileModelTest, QuirkyCandidatesRunLikeThePlainStepUnderEveryPlan) {
  torch::manual_seed(0);
  Quirky model;
  const torch::Tensor x = torch::randn({128, 96});
  expect_every_plan_is_the_plain_step(
      model.ptr(), [&] { return model->forward(x); }, 30);
}

// A recurrent cell shared by every time step, each step a candidate (named by its step) taking a
// view of the sequence and returning its state as a tuple: a chain of candidates with one set of
// parameters.
struct LoopImpl : torch::nn::Module {
  torch::nn::LSTMCell cell{nullptr};
  torch::nn::Linear head{nullptr};

  LoopImpl() {
    cell = register_module("cell", torch::nn::LSTMCell(48, 96));
    head = register_module("head", torch::nn::Linear(96, 8));
  }

  torch::Tensor forward(const torch::Tensor& sequence) {
    torch::Tensor h = torch::zeros({sequence.size(1), 96});
    torch::Tensor c = torch::zeros_like(h);
    for (int64_t t = 0; t < sequence.size(0); ++t) {
      std::tie(h, c) = ckpt::candidate(
          "step" + std::to_string(t),
          [this](const torch::Tensor& x, const torch::Tensor& h0, const torch::Tensor& c0) {
            auto [h1, c1] = cell(x, std::make_tuple(h0, c0));
            return std::make_tuple(h1, c1);
          },
          sequence.select(0, t), h, c);
    }
    return head(h).pow(2).mean();
  }
};
TORCH_MODULE(Loop);

TEST(HostileModelTest, ALoopOfCandidatesSharingACellRunsLikeThePlainStepUnderEveryPlan) {
  torch::manual_seed(0);
  Loop model;
  const torch::Tensor sequence = torch::randn({6, 64, 48}, torch::requires_grad());
  expect_every_plan_is_the_plain_step(
      model.ptr(), [&] { return model->forward(sequence); }, 30);
}

// Takers of slices of an output, a tensor passed twice to one candidate, and an in-place write
// into a slice of an output after its candidate.
struct SlicesImpl : torch::nn::Module {
  torch::nn::Linear first{nullptr}, left{nullptr}, right{nullptr};

  SlicesImpl() {
    first = register_module("first", torch::nn::Linear(64, 128));
    left = register_module("left", torch::nn::Linear(64, 64));
    right = register_module("right", torch::nn::Linear(64, 64));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    auto h = ckpt::candidate(
        "first", [this](const torch::Tensor& v) { return torch::gelu(first(v)); }, x);
    auto l = ckpt::candidate(
        "left", [this](const torch::Tensor& v) { return torch::tanh(left(v)); },
        h.narrow(1, 0, 64));
    auto r = ckpt::candidate(
        "right", [this](const torch::Tensor& v) { return right(v) * 0.5 + v; },
        h.narrow(1, 64, 64));
    r.narrow(0, 0, 8).mul_(2);
    auto both = ckpt::candidate(
        "both", [](const torch::Tensor& a, const torch::Tensor& b) { return a * b + a.sigmoid(); },
        l, l);
    auto joined = ckpt::candidate(
        "joined",
        [](const torch::Tensor& a, const torch::Tensor& b) {
          return torch::cat({a, b}, 1).exp();
        },
        both, r);
    return joined.pow(2).mean();
  }
};
TORCH_MODULE(Slices);

TEST(HostileModelTest, SlicedAndRepeatedArgumentsRunLikeThePlainStepUnderEveryPlan) {
  torch::manual_seed(0);
  Slices model;
  const torch::Tensor x = torch::randn({256, 64});
  expect_every_plan_is_the_plain_step(
      model.ptr(), [&] { return model->forward(x); }, 30);
}

// A loss that holds a gradient penalty (WGAN-GP): the step function itself differentiates through
// the candidates' saved tensors, in every profiling step too, the first included (whose saved
// tensors it once refused to give back). "both" uses its argument twice, so the second backward
// sums its gradients in another order: equal within rounding.
TEST(HostileModelTest, ALossWithAGradientPenaltyInsideRunsLikeThePlainStepUnderEveryPlan) {
  torch::manual_seed(0);
  Slices model;
  const torch::Tensor x = torch::randn({256, 64});
  expect_every_plan_is_the_plain_step(
      model.ptr(),
      [&] {
        const torch::Tensor input = x.detach().requires_grad_();
        const torch::Tensor out = model->forward(input);
        const torch::Tensor g = torch::autograd::grad({out}, {input}, {}, true, true)[0];
        return out + g.pow(2).mean();
      },
      10, /*close=*/true);
}

// Outputs that share storage (a tensor and a view of it), an output that needs no gradient (a
// mask) beside one that does, and an expanded (stride 0) argument.
struct SharedImpl : torch::nn::Module {
  torch::nn::Linear in{nullptr}, out{nullptr};

  SharedImpl() {
    in = register_module("in", torch::nn::Linear(64, 128));
    out = register_module("out", torch::nn::Linear(64, 64));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    auto [whole, half] = ckpt::candidate(
        "split",
        [this](const torch::Tensor& v) {
          auto h = torch::tanh(in(v));
          return std::make_tuple(h, h.narrow(1, 0, 64));
        },
        x);
    auto [kept, mask] = ckpt::candidate(
        "mask",
        [](const torch::Tensor& v) {
          auto m = (v > 0).to(torch::kFloat);
          return std::make_tuple(torch::sigmoid(v) * m, m);
        },
        half);
    auto scale = ckpt::candidate(
        "scale", [](const torch::Tensor& v) { return v.sum(0, /*keepdim=*/true).exp(); }, kept);
    auto mixed = ckpt::candidate(
        "mix",
        [this](const torch::Tensor& a, const torch::Tensor& s, const torch::Tensor& m) {
          return torch::tanh(out(a * s) + m);
        },
        whole.narrow(1, 64, 64), scale.expand({whole.size(0), 64}), mask);
    return mixed.pow(2).mean();
  }
};
TORCH_MODULE(Shared);

TEST(HostileModelTest, OutputsSharingStorageMasksAndExpandedArgumentsRunLikeThePlainStep) {
  torch::manual_seed(0);
  Shared model;
  const torch::Tensor x = torch::randn({256, 64});
  expect_every_plan_is_the_plain_step(
      model.ptr(), [&] { return model->forward(x); }, 30);
}

// One BatchNorm shared by three candidates in a loop of lambdas (its statistics updated three
// times a step), and a BatchNorm inside a candidate whose output the next one drops and runs
// again: each update happens once, as in the plain step.
struct SharedNormImpl : torch::nn::Module {
  torch::nn::Linear a{nullptr}, b{nullptr};
  torch::nn::BatchNorm1d shared{nullptr}, own{nullptr};

  SharedNormImpl() {
    a = register_module("a", torch::nn::Linear(64, 64));
    b = register_module("b", torch::nn::Linear(64, 64));
    shared = register_module("shared", torch::nn::BatchNorm1d(64));
    own = register_module("own", torch::nn::BatchNorm1d(64));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h = ckpt::candidate(
        "first", [this](const torch::Tensor& v) { return torch::relu(own(a(v))); }, x);
    for (int i = 0; i < 3; ++i) {
      h = ckpt::candidate(
          "loop" + std::to_string(i),
          [this](const torch::Tensor& v) { return v + torch::tanh(shared(b(v))); }, h);
    }
    return h.pow(2).mean();
  }
};
TORCH_MODULE(SharedNorm);

TEST(HostileModelTest, BatchNormsSharedAndRecomputedUpdateTheirStatisticsOnce) {
  torch::manual_seed(0);
  SharedNorm model;
  const torch::Tensor x = torch::randn({256, 64});
  expect_every_plan_is_the_plain_step(
      model.ptr(), [&] { return model->forward(x); }, 30);
}

// Blocks marked over parts of their own, the parts as users write them: a module part, one that
// writes into its argument in place, one that draws dropout after a BatchNorm, one that returns a
// view beside a new tensor, and a part with parts inside it (three levels). The blocks are a
// Sequential's elements marked with `apply_candidates`; plans run them whole, checkpointed with
// their parts checkpointed too, or recomputed for the next block.
struct PartsBlockImpl : torch::nn::Module {
  torch::nn::Linear in{nullptr}, out{nullptr};
  torch::nn::BatchNorm1d norm{nullptr};
  torch::nn::Dropout drop{nullptr};

  PartsBlockImpl() {
    in = register_module("in", torch::nn::Linear(64, 64));
    out = register_module("out", torch::nn::Linear(64, 64));
    norm = register_module("norm", torch::nn::BatchNorm1d(64));
    drop = register_module("drop", torch::nn::Dropout(0.2));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h = ckpt::candidate(in, x);
    h = ckpt::candidate(
        *this, "relu_in_place", [](torch::Tensor v) { return v.relu_(); }, h);
    auto [t, gate] = ckpt::candidate(
        *this, "noisy",
        [this](const torch::Tensor& v) {
          torch::Tensor n = drop(norm(v));
          return std::make_tuple(n.t(), torch::sigmoid(n));
        },
        h);
    torch::Tensor mixed = ckpt::candidate(
        *this, "deep",
        [this](const torch::Tensor& a, const torch::Tensor& g) {
          torch::Tensor inner = ckpt::candidate(
              *this, "deep.inner", [](const torch::Tensor& v) { return torch::tanh(v); }, a.t());
          return ckpt::candidate(out, inner * g);
        },
        t, gate);
    return x + mixed;
  }
};
TORCH_MODULE(PartsBlock);

TEST(HostileModelTest, BlocksMarkedOverTheirPartsRunLikeThePlainStepUnderEveryPlan) {
  torch::manual_seed(0);
  torch::nn::Sequential blocks{PartsBlock(), PartsBlock(), PartsBlock()};
  ckpt::apply_candidates(*blocks, [](const std::string& name, const torch::nn::Module&) {
    return name.find('.') == std::string::npos;  // the blocks, not their modules
  });
  const torch::Tensor x = torch::randn({128, 64});
  expect_every_plan_is_the_plain_step(
      blocks.ptr(), [&] { return blocks->forward(x).pow(2).mean(); }, 30);
}

// Candidates reached more than once in a step, each call a candidate of its own: a GAN's
// discriminator (its elements marked with `apply_candidates`: dropout, BatchNorm) applied to real
// samples and to the generator's, a layer whose weights three depths share, and a block with parts
// marked inside it called twice, the second time on the first call's output.
struct TwoCallsImpl : torch::nn::Module {
  torch::nn::Sequential generator{nullptr}, discriminator{nullptr};
  torch::nn::Linear tied{nullptr};
  PartsBlock twice{nullptr};

  TwoCallsImpl() {
    generator = register_module(
        "generator", torch::nn::Sequential(torch::nn::Linear(16, 64), torch::nn::Tanh()));
    discriminator = register_module(
        "discriminator", torch::nn::Sequential(torch::nn::Linear(64, 96), torch::nn::LeakyReLU(),
                                               torch::nn::Dropout(0.2), torch::nn::Linear(96, 96),
                                               torch::nn::BatchNorm1d(96), torch::nn::LeakyReLU(),
                                               torch::nn::Linear(96, 1)));
    ckpt::apply_candidates(*discriminator,
                           [](const std::string&, const torch::nn::Module&) { return true; });
    tied = register_module("tied", torch::nn::Linear(64, 64));
    twice = register_module("twice", PartsBlock());
  }

  torch::Tensor forward(const torch::Tensor& real, const torch::Tensor& noise) {
    torch::Tensor fake = ckpt::candidate(generator, noise);
    for (int depth = 0; depth < 3; ++depth) fake = fake + ckpt::candidate(tied, fake).tanh();
    fake = ckpt::candidate(twice, ckpt::candidate(twice, fake));
    return torch::softplus(-discriminator->forward(real)).mean() +
           torch::softplus(discriminator->forward(fake)).mean();
  }
};
TORCH_MODULE(TwoCalls);

TEST(HostileModelTest, CandidatesReachedMoreThanOnceRunLikeThePlainStepUnderEveryPlan) {
  torch::manual_seed(0);
  TwoCalls model;
  const torch::Tensor real = torch::randn({128, 64});
  const torch::Tensor noise = torch::randn({128, 16});
  const LossFn loss_fn = [&] { return model->forward(real, noise); };
  const ckpt::MeasuredModel measured = ckpt::profile_model(model.ptr(), loss_fn);
  std::vector<std::string> names;
  for (const auto& candidate : measured.candidates) names.push_back(candidate.name);
  const std::vector<std::string> expected = {"generator",
                                             "tied",
                                             "tied#2",
                                             "tied#3",
                                             "twice",
                                             "twice#2",
                                             "discriminator.0",
                                             "discriminator.1",
                                             "discriminator.2",
                                             "discriminator.3",
                                             "discriminator.4",
                                             "discriminator.5",
                                             "discriminator.6",
                                             "discriminator.0#2",
                                             "discriminator.1#2",
                                             "discriminator.2#2",
                                             "discriminator.3#2",
                                             "discriminator.4#2",
                                             "discriminator.5#2",
                                             "discriminator.6#2"};
  EXPECT_EQ(names, expected);
  expect_every_plan_is_the_plain_step(model.ptr(), loss_fn, 30);
}

}  // namespace hostile_model_test
