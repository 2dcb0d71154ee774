// Issue 51, item 2: CheckpointOptions::check_values. The forward records a checksum of every
// operator's outputs and the recompute compares: a recompute that computes other values than its
// forward (a nondeterministic kernel, state outside the region written before the backward, a
// draw from a generator the region does not replay) raises an error naming the first operator
// that differs, where it would otherwise give wrong gradients without a word.

#include <ckpt/ckpt.h>
#include <ckpt/selective.h>

#include "support/support.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/library.h>

#include <atomic>
#include <optional>
#include <string>
#include <vector>

namespace value_check_test {

using ckpt::test::bit_equal;

// An operator of one's own that gives another result at every call, as a kernel with unordered
// atomics may: its CPU kernel adds a call counter.
std::atomic<int> noisy_calls{0};

at::Tensor noisy_kernel(const at::Tensor& x) {
  return x + static_cast<double>(noisy_calls.fetch_add(1));
}

TORCH_LIBRARY(ckpt_value_check_test, m) {
  m.def("noisy(Tensor x) -> Tensor");
}
TORCH_LIBRARY_IMPL(ckpt_value_check_test, CPU, m) {
  m.impl("noisy", &noisy_kernel);
}

at::Tensor noisy(const at::Tensor& x) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("ckpt_value_check_test::noisy", "")
                             .typed<at::Tensor(const at::Tensor&)>();
  return op.call(x);
}

const ckpt::CheckpointOptions kChecked = ckpt::CheckpointOptions().check_values(true);

struct ValueCheckTest : ckpt::test::SeedingFixture {
  torch::nn::Linear first{16, 32}, second{32, 16};
  torch::nn::BatchNorm1d norm{32};
  torch::Tensor x = torch::randn({8, 16}, torch::requires_grad());

  torch::Tensor block(const torch::Tensor& input, torch::nn::BatchNorm1d& bn) {
    return second(torch::dropout(torch::relu(bn(first(input))), 0.3, true));
  }

  // One step's loss, input gradient, parameter gradients and buffers.
  std::vector<torch::Tensor> step(const c10::optional<ckpt::CheckpointOptions>& options) {
    for (auto* m : std::vector<torch::nn::Module*>{first.get(), second.get(), norm.get()}) {
      for (auto& p : m->parameters()) p.mutable_grad().reset();
    }
    x.mutable_grad().reset();
    const auto fn = [this](const torch::Tensor& t, torch::nn::BatchNorm1d& bn) {
      return block(t, bn);
    };
    torch::manual_seed(11);
    torch::Tensor y = options ? ckpt::checkpoint(*options, fn, x, norm) : fn(x, norm);
    torch::Tensor loss = y.pow(2).mean();
    loss.backward();
    std::vector<torch::Tensor> result{loss.detach(), x.grad().clone()};
    for (auto* m : std::vector<torch::nn::Module*>{first.get(), second.get(), norm.get()}) {
      for (auto& p : m->parameters()) result.push_back(p.grad().clone());
      for (auto& b : m->buffers()) result.push_back(b.clone());
    }
    return result;
  }
};

void expect_bitwise(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(bit_equal(a[i], b[i])) << "tensor #" << i;
}

TEST_F(ValueCheckTest, ADeterministicRegionPassesAndGivesThePlainStepsBits) {
  const auto state = norm->buffers();
  std::vector<torch::Tensor> saved;
  for (const auto& b : state) saved.push_back(b.clone());
  const auto restore = [&] {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < state.size(); ++i) state[i].copy_(saved[i]);
  };
  const auto plain = step(c10::nullopt);
  for (const auto& options :
       {kChecked, ckpt::CheckpointOptions(kChecked).policy(ckpt::save_matmuls()),
        ckpt::CheckpointOptions(kChecked).use_reentrant(true),
        ckpt::CheckpointOptions(kChecked).early_stop(true)}) {
    restore();
    expect_bitwise(step(options), plain);
  }
}

TEST_F(ValueCheckTest, ANondeterministicOperatorIsNamedWithBothChecksums) {
  const auto fn = [](const torch::Tensor& t) {
    return (t * torch::sigmoid(noisy(t.detach()))).sum();
  };
  torch::Tensor loss = ckpt::checkpoint(kChecked, fn, x);
  CKPT_EXPECT_THROWS_WITH(loss.backward(),
                          "first at ckpt_value_check_test::noisy (checked operator #0 of the "
                          "region), output #0: Float [8, 16] with checksum 0x");
  // Unchecked, the same region gives gradients of another mask, without a word.
  x.mutable_grad().reset();
  torch::Tensor unchecked = ckpt::checkpoint(fn, x);
  EXPECT_NO_THROW(unchecked.backward());
}

// A sample of operators: only theirs are checksummed; the others keep their place in the check.
TEST_F(ValueCheckTest, ASampleOfOperatorsChecksTheirValuesOnly) {
  const auto fn = [](const torch::Tensor& t) {
    return (t * torch::sigmoid(noisy(t.detach()))).sum();
  };
  torch::Tensor loss = ckpt::checkpoint(
      ckpt::CheckpointOptions().check_values(true).check_values_ops({"aten::sigmoid"}), fn, x);
  CKPT_EXPECT_THROWS_WITH(loss.backward(),
                          "first at aten::sigmoid (checked operator #1 of the region)");
  x.mutable_grad().reset();
  torch::Tensor unsampled = ckpt::checkpoint(
      ckpt::CheckpointOptions().check_values(true).check_values_ops({"aten::mm"}), fn, x);
  EXPECT_NO_THROW(unsampled.backward());
}

TEST_F(ValueCheckTest, StateOutsideTheRegionWrittenBeforeTheBackwardIsFound) {
  torch::Tensor scale = torch::full({16}, 2.0);
  const auto fn = [&scale](const torch::Tensor& t) { return (t * scale).tanh().sum(); };
  torch::Tensor loss = ckpt::checkpoint(kChecked, fn, x);
  // The captured variable names another tensor now: no version counter moved (an in-place write
  // into it is an error before any value is compared: CheckpointErrorsTest).
  scale = scale * 3;
  try {
    loss.backward();
    ADD_FAILURE() << "no error";
  } catch (const c10::Error& e) {
    const std::string message = e.what_without_backtrace();
    EXPECT_NE(message.find("first at aten::mul.Tensor (checked operator #0"), std::string::npos)
        << message;
    EXPECT_NE(message.find("state outside the region changed"), std::string::npos) << message;
  }
}

// A hostile probe: under a selective policy the recompute hands a kept product out instead of
// computing it, so a captured tensor only that product read, written in place after the forward,
// changed no compared output while the product's backward read its new values (the input
// gradient off by 4.35). What a kept operator read from outside the region is compared now.
TEST_F(ValueCheckTest, WhatAKeptOperatorReadFromOutsideTheRegionIsCompared) {
  torch::Tensor g = torch::randn({16, 16});
  const auto fn = [&g](const torch::Tensor& t) { return t.tanh().mm(g).sin(); };
  const auto selective = ckpt::CheckpointOptions(kChecked).policy(ckpt::save_matmuls());
  torch::Tensor loss = ckpt::checkpoint(selective, fn, x).sum();
  g = g * 3;  // read by the kept mm alone (another tensor: no version counter moved)
  try {
    loss.backward();
    ADD_FAILURE() << "no error";
  } catch (const c10::Error& e) {
    const std::string message = e.what_without_backtrace();
    EXPECT_NE(message.find("handed out the kept output of aten::mm (checked operator #1"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("tensor #1 of its arguments, from outside the region"),
              std::string::npos)
        << message;
  }
  // Unwritten, it passes with the plain step's gradient.
  x.mutable_grad().reset();
  fn(x).sum().backward();
  const torch::Tensor plain = x.grad().clone();
  x.mutable_grad().reset();
  ckpt::checkpoint(selective, fn, x).sum().backward();
  EXPECT_TRUE(bit_equal(x.grad(), plain));
}

// False alarms a hostile probe found, each on a deterministic function. A selective region hands
// out a kept matrix product that the forward then wrote into (a Linear on 3-d input adds its bias
// in place; a block that adds in place after mm): its checksum was taken of the written data and
// compared with the product's. The reentrant forward runs without grad, where `1 / t` writes in
// place, and its recompute with grad, where it clones first: the operators were compared one by
// one and parted.
TEST_F(ValueCheckTest, KeptOutputsWrittenInPlaceAndGradModeDecompositionsPass) {
  torch::nn::Linear linear(16, 16);
  const torch::Tensor w = torch::randn({16, 16});
  const std::vector<std::pair<std::string, std::function<torch::Tensor(const torch::Tensor&)>>>
      functions{{"3-d linear",
                 [&](const torch::Tensor& t) {
                   return torch::tanh(linear(t.view({2, 4, 16})));
                 }},
                {"add_ after mm", [&](const torch::Tensor& t) { return t.mm(w).add_(1).tanh(); }},
                {"1 / t", [](const torch::Tensor& t) { return (1.0 / t).tanh(); }}};
  const auto grads_of = [&](const std::function<torch::Tensor(const torch::Tensor&)>& fn,
                            const c10::optional<ckpt::CheckpointOptions>& options) {
    x.mutable_grad().reset();
    linear->zero_grad();
    (options ? ckpt::checkpoint(*options, fn, x) : fn(x)).pow(2).sum().backward();
    return std::vector<torch::Tensor>{x.grad().clone(), linear->weight.grad().defined()
                                                            ? linear->weight.grad().clone()
                                                            : torch::zeros({1})};
  };
  for (const auto& [name, fn] : functions) {
    SCOPED_TRACE(name);
    const auto plain = grads_of(fn, c10::nullopt);
    for (const auto& options : {ckpt::CheckpointOptions(kChecked).policy(ckpt::save_matmuls()),
                                ckpt::CheckpointOptions(kChecked).use_reentrant(true)}) {
      expect_bitwise(grads_of(fn, options), plain);
    }
  }
}

// Where the reentrant variant's operators part from its forward's, the region's outputs are still
// compared: a captured tensor written after the forward is found.
TEST_F(ValueCheckTest, TheReentrantVariantComparesItsOutputsWhereItsOperatorsPart) {
  torch::Tensor scale = torch::full({16}, 2.0);
  const auto fn = [&scale](const torch::Tensor& t) { return (1.0 / t) * scale; };
  torch::Tensor loss =
      ckpt::checkpoint(ckpt::CheckpointOptions(kChecked).use_reentrant(true), fn, x).sum();
  scale = scale * 3;
  CKPT_EXPECT_THROWS_WITH(loss.backward(), "other values than its forward for output #0");
}

TEST_F(ValueCheckTest, ADrawFromAGeneratorTheRegionDoesNotReplayIsFound) {
  at::Generator own = at::make_generator<at::CPUGeneratorImpl>(42);
  const auto fn = [&own](const torch::Tensor& t) {
    return (t * torch::rand({16}, own, torch::TensorOptions())).sum();
  };
  torch::Tensor loss = ckpt::checkpoint(kChecked, fn, x);
  CKPT_EXPECT_THROWS_WITH(loss.backward(), "first at aten::rand");
}

TEST_F(ValueCheckTest, TheProcessWideSwitchChecksEveryRegionAndOperatorsWithoutValuesAreSkipped) {
  torch::Tensor scale = torch::full({16}, 2.0);
  const auto fn = [&scale](const torch::Tensor& t) {
    torch::Tensor scratch = torch::empty({64});  // uninitialised: differs, and is not checked
    torch::Tensor view = t.view({16, 8});        // a view: its base is checked
    return (view.view({8, 16}) * scale).sum() + scratch.numel();
  };
  ckpt::set_checkpoint_check_values(true);
  torch::Tensor passing = ckpt::checkpoint(fn, x);
  EXPECT_NO_THROW(passing.backward());
  torch::Tensor failing = ckpt::checkpoint(fn, x);
  scale = scale + 1;
  CKPT_EXPECT_THROWS_WITH(failing.backward(), "computed other values than its forward");
  ckpt::set_checkpoint_check_values(std::nullopt);
  EXPECT_FALSE(ckpt::checkpoint_check_values().has_value());
  torch::Tensor unchecked = ckpt::checkpoint(fn, x);
  scale = scale + 1;
  EXPECT_NO_THROW(unchecked.backward());
}

}  // namespace value_check_test
