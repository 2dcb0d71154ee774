// Names for selective checkpointing: checkpoint_name() and save_names(). A named tensor's
// producer runs once per step while unnamed operators run again; gradients are the plain ones to
// the bit; names belong to the innermost region with a policy; Checkpointed and
// checkpoint_sequential take the policy; a name given twice in a region is a clear error.

#include <ckpt/modules.h>
#include <ckpt/sequential.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "support/support.h"

#include <atomic>
#include <string>
#include <vector>

namespace names_test {

using ckpt::test::bit_equal;
using ckpt::test::take_grads;

// Two custom operators whose CPU kernels count their calls: y = 2x and y = 3x, each with its own
// autograd formula, so that a count says which of them a recompute ran.
std::atomic<int> double_calls{0}, triple_calls{0};

template <int kFactor>
at::Tensor counted_kernel(const at::Tensor& x) {
  ++(kFactor == 2 ? double_calls : triple_calls);
  return x * kFactor;
}

template <int kFactor>
class Counted : public torch::autograd::Function<Counted<kFactor>> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* /*ctx*/, const at::Tensor& x) {
    static const auto op =
        c10::Dispatcher::singleton()
            .findSchemaOrThrow(kFactor == 2 ? "ckpt_names_test::double" : "ckpt_names_test::triple",
                               "")
            .template typed<at::Tensor(const at::Tensor&)>();
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    return op.call(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* /*ctx*/,
                                                 torch::autograd::variable_list grads) {
    return {grads[0] * kFactor};
  }
};

TORCH_LIBRARY(ckpt_names_test, m) {
  m.def("double(Tensor x) -> Tensor");
  m.def("triple(Tensor x) -> Tensor");
}
TORCH_LIBRARY_IMPL(ckpt_names_test, CPU, m) {
  m.impl("double", counted_kernel<2>);
  m.impl("triple", counted_kernel<3>);
}
TORCH_LIBRARY_IMPL(ckpt_names_test, Autograd, m) {
  m.impl("double", [](const at::Tensor& x) { return Counted<2>::apply(x); });
  m.impl("triple", [](const at::Tensor& x) { return Counted<3>::apply(x); });
}

at::Tensor twice(const at::Tensor& x) {
  return Counted<2>::apply(x);
}
at::Tensor thrice(const at::Tensor& x) {
  return Counted<3>::apply(x);
}

struct Calls {
  int doubles, triples;
};

// The kernel calls of one forward and backward of `step`.
template <class Step>
Calls count_calls(Step step) {
  double_calls = 0;
  triple_calls = 0;
  step();
  return {double_calls.load(), triple_calls.load()};
}

// A block that names the result of its first counted operator: y = tanh(3 * (2 * fc(x))).
struct NamedBlock : torch::nn::Module {
  NamedBlock() : fc(register_module("fc", torch::nn::Linear(8, 8))) {}
  at::Tensor forward(const at::Tensor& x) {
    const at::Tensor h = ckpt::checkpoint_name(twice(fc(x)), "doubled");
    return torch::tanh(thrice(h));
  }
  torch::nn::Linear fc;
};

const ckpt::CheckpointOptions kSaveDoubled =
    ckpt::CheckpointOptions().policy(ckpt::save_names({"doubled"}));

TEST(CheckpointNameTest, OutsideARegionItIsTheSameTensorAndPassesTheGradient) {
  const auto x = torch::randn({3}, torch::requires_grad());
  const auto y = x * 2;
  const auto named = ckpt::checkpoint_name(y, "y");
  EXPECT_TRUE(named.is_same(y));
  (named * 3).sum().backward();
  EXPECT_TRUE(bit_equal(x.grad(), torch::full({3}, 6.0f)));
  // In a region without a policy too.
  auto z = ckpt::checkpoint(
      [](const at::Tensor& t) { return ckpt::checkpoint_name(t.sin(), "s").cos(); }, x);
  x.mutable_grad().reset();
  z.sum().backward();
  EXPECT_TRUE(bit_equal(x.grad(), -x.detach().cos() * x.detach().sin().sin()));
  CKPT_EXPECT_THROWS_WITH(ckpt::checkpoint_name(y, ""), "the name is empty");
  CKPT_EXPECT_THROWS_WITH(ckpt::checkpoint_name(at::Tensor(), "u"), "is undefined");
}

TEST(CheckpointNameTest, TheNamedProducerRunsOncePerStepAndTheOthersAgain) {
  torch::manual_seed(0);
  auto block = std::make_shared<NamedBlock>();
  const auto input = torch::randn({4, 8});
  auto step = [&](const c10::optional<ckpt::CheckpointOptions>& options) {
    auto x = input.detach().requires_grad_();
    auto y = options ? ckpt::checkpoint(*options, block, x) : block->forward(x);
    y.square().sum().backward();
    return std::make_pair(y.detach(), x.grad());
  };
  std::pair<at::Tensor, at::Tensor> plain, named;
  const Calls plain_calls = count_calls([&] { plain = step(c10::nullopt); });
  const auto plain_grads = take_grads(*block);
  const Calls full = count_calls([&] { step(ckpt::CheckpointOptions()); });
  const Calls kept = count_calls([&] { named = step(kSaveDoubled); });
  EXPECT_EQ(plain_calls.doubles, 1);
  EXPECT_EQ(full.doubles, 2);  // forward and recompute
  EXPECT_EQ(full.triples, 2);
  EXPECT_EQ(kept.doubles, 1);  // the named producer: forward only
  EXPECT_EQ(kept.triples, 2);  // unnamed: recomputed
  EXPECT_TRUE(bit_equal(named.first, plain.first));
  EXPECT_TRUE(bit_equal(named.second, plain.second));
  take_grads(*block);  // the full-recompute step's
  step(kSaveDoubled);
  const auto grads = take_grads(*block);
  for (size_t i = 0; i < grads.size(); ++i) EXPECT_TRUE(bit_equal(grads[i], plain_grads[i])) << i;
  // A name the policy does not save changes nothing.
  const Calls other =
      count_calls([&] { step(ckpt::CheckpointOptions().policy(ckpt::save_names({"other"}))); });
  EXPECT_EQ(other.doubles, 2);
}

// A view of the data (a reshape, a transpose) names the call that computed the data, as does the
// result of an in-place write into it that nothing read before (Linear's bias add): the view runs
// again in the recompute, and the write's kernel does not (the kept data holds its result).
TEST(CheckpointNameTest, NamingAViewOrAWrittenResultKeepsTheCallThatComputedItsData) {
  const auto input = torch::randn({4, 6}, torch::requires_grad());
  auto fn = [](const at::Tensor& x) {
    auto viewed = ckpt::checkpoint_name(twice(x.sin()).t().add_(1), "doubled");
    return thrice(viewed).cos();
  };
  const auto plain = torch::autograd::grad({fn(input).sum()}, {input})[0];
  at::Tensor grad;
  const Calls calls = count_calls([&] {
    grad = torch::autograd::grad({ckpt::checkpoint(kSaveDoubled, fn, input).sum()}, {input})[0];
  });
  EXPECT_EQ(calls.doubles, 1);
  EXPECT_EQ(calls.triples, 2);
  EXPECT_TRUE(bit_equal(grad, plain));
}

// An attention-like block with dropout, layer norm and Linears on 3-d input: any set of names,
// alone or with an operator policy, gives the plain step to the bit.
struct Attention : torch::nn::Module {
  Attention()
      : qkv(register_module("qkv", torch::nn::Linear(16, 48))),
        out(register_module("out", torch::nn::Linear(16, 16))),
        dropout(register_module("dropout", torch::nn::Dropout(0.2))) {}
  at::Tensor forward(const at::Tensor& x) {
    auto h = ckpt::checkpoint_name(torch::layer_norm(x, {16}), "normed");
    auto parts = qkv(h).chunk(3, -1);
    auto scores =
        ckpt::checkpoint_name(torch::matmul(parts[0], parts[1].transpose(1, 2)) / 4, "scores");
    auto attention = dropout(torch::softmax(scores, -1));
    auto mixed = ckpt::checkpoint_name(torch::matmul(attention, parts[2]), "mixed");
    return x + ckpt::checkpoint_name(out(mixed), "attn_out");
  }
  torch::nn::Linear qkv, out;
  torch::nn::Dropout dropout;
};

TEST(CheckpointNameTest, AnySetOfNamesGivesThePlainStepToTheBit) {
  torch::manual_seed(0);
  auto block = std::make_shared<Attention>();
  const auto input = torch::randn({2, 5, 16});
  auto step = [&](const c10::optional<ckpt::CheckpointOptions>& options) {
    torch::manual_seed(7);
    auto x = input.detach().requires_grad_();
    auto y = options ? ckpt::checkpoint(*options, block, x) : block->forward(x);
    y.square().sum().backward();
    std::vector<at::Tensor> result{y.detach(), x.grad()};
    for (auto& grad : take_grads(*block)) result.push_back(grad);
    return result;
  };
  const auto plain = step(c10::nullopt);
  const std::vector<std::string> names{"normed", "scores", "mixed", "attn_out"};
  for (size_t mask = 1; mask < 16; ++mask) {
    std::vector<std::string> chosen;
    for (size_t i = 0; i < names.size(); ++i) {
      if (mask & (1u << i)) chosen.push_back(names[i]);
    }
    for (bool with_matmuls : {false, true}) {
      auto policy =
          ckpt::save_names(chosen, with_matmuls ? ckpt::save_matmuls() : ckpt::SelectivePolicy());
      const auto result = step(ckpt::CheckpointOptions().policy(policy));
      ASSERT_EQ(result.size(), plain.size());
      for (size_t i = 0; i < result.size(); ++i) {
        EXPECT_TRUE(bit_equal(result[i], plain[i])) << "names " << mask << ", tensor " << i;
      }
    }
  }
}

// Each Checkpointed block keeps its own named tensor, also while the outer region recomputes it;
// the outer region does not see the inner names (the two blocks both name "doubled"). A name in
// the outer region's own code is the outer region's.
TEST(CheckpointNameTest, NamesBelongToTheInnermostRegionWithAPolicy) {
  torch::manual_seed(0);
  auto first = std::make_shared<NamedBlock>(), second = std::make_shared<NamedBlock>();
  ckpt::Checkpointed inner_first(first, kSaveDoubled), inner_second(second, kSaveDoubled);
  const auto input = torch::randn({4, 8});
  auto plain_fn = [&](const at::Tensor& x) { return second->forward(first->forward(x)); };
  auto x = input.detach().requires_grad_();
  plain_fn(x).sum().backward();
  const auto plain_grads = take_grads(*first);

  auto nested = [&](const at::Tensor& t) { return inner_second->forward(inner_first->forward(t)); };
  auto y = input.detach().requires_grad_();
  const Calls calls =
      count_calls([&] { ckpt::checkpoint(kSaveDoubled, nested, y).sum().backward(); });
  // Per block: the outer forward and the outer recompute; the inner recomputes run none.
  EXPECT_EQ(calls.doubles, 4);
  EXPECT_EQ(calls.triples, 6);
  EXPECT_TRUE(bit_equal(y.grad(), x.grad()));
  const auto grads = take_grads(*first);
  for (size_t i = 0; i < grads.size(); ++i) EXPECT_TRUE(bit_equal(grads[i], plain_grads[i]));

  // Inner regions without a policy: the outer region sees the name and keeps the producer.
  auto outer_named = [&](const at::Tensor& t) {
    return ckpt::checkpoint([&](const at::Tensor& u) { return first->forward(u); }, t);
  };
  const Calls outer =
      count_calls([&] { ckpt::checkpoint(kSaveDoubled, outer_named, y).sum().backward(); });
  EXPECT_EQ(outer.doubles, 2);  // outer forward, the inner recompute; not the outer recompute
  EXPECT_EQ(outer.triples, 3);
}

TEST(CheckpointNameTest, CheckpointedAndCheckpointSequentialTakeTheNamePolicy) {
  torch::manual_seed(0);
  std::vector<std::shared_ptr<NamedBlock>> blocks;
  torch::nn::Sequential model;
  for (int i = 0; i < 3; ++i) {
    blocks.push_back(std::make_shared<NamedBlock>());
    model->push_back(blocks.back());
  }
  const auto input = torch::randn({4, 8});
  auto x = input.detach().requires_grad_();
  model->forward(x).sum().backward();
  const auto plain_grads = take_grads(*model);
  auto expect_plain = [&](const at::Tensor& grad) {
    EXPECT_TRUE(bit_equal(grad, x.grad()));
    const auto grads = take_grads(*model);
    for (size_t i = 0; i < grads.size(); ++i) EXPECT_TRUE(bit_equal(grads[i], plain_grads[i]));
  };

  auto y = input.detach().requires_grad_();
  const Calls sequential =
      count_calls([&] { ckpt::checkpoint_sequential(model, 3, y, kSaveDoubled).sum().backward(); });
  EXPECT_EQ(sequential.doubles, 3);  // the last segment runs without checkpointing anyway
  EXPECT_EQ(sequential.triples, 5);
  expect_plain(y.grad());

  ckpt::Checkpointed wrapped(blocks[1], kSaveDoubled);
  auto z = input.detach().requires_grad_();
  const Calls checkpointed = count_calls(
      [&] { blocks[2]->forward(wrapped->forward(blocks[0]->forward(z))).sum().backward(); });
  EXPECT_EQ(checkpointed.doubles, 3);
  EXPECT_EQ(checkpointed.triples, 4);
  expect_plain(z.grad());

  // Two blocks in one segment name "doubled" twice in one region.
  model->push_back(std::make_shared<NamedBlock>());
  auto w = input.detach().requires_grad_();
  CKPT_EXPECT_THROWS_WITH(ckpt::checkpoint_sequential(model, 2, w, kSaveDoubled),
                          "the name \"doubled\" was given twice");
}

// The error leaves grad mode, the random stream and the modules' buffers as they were, leaves no
// mode behind, and the next call at the same place works.
struct NamesTwice : torch::nn::Module {
  NamesTwice()
      : norm(register_module("norm", torch::nn::BatchNorm1d(8))),
        dropout(register_module("dropout", torch::nn::Dropout(0.5))) {}
  at::Tensor forward(const at::Tensor& x) {
    auto h = ckpt::checkpoint_name(dropout(norm(x)), "h");
    return ckpt::checkpoint_name(h.tanh(), twice ? "h" : "g");
  }
  torch::nn::BatchNorm1d norm;
  torch::nn::Dropout dropout;
  bool twice = true;
};

TEST(CheckpointNameTest, ANameGivenTwiceInARegionIsAClearErrorThatLeavesStateAsItWas) {
  torch::manual_seed(0);
  auto module = std::make_shared<NamesTwice>();
  const auto input = torch::randn({4, 8}, torch::requires_grad());
  const auto mean_before = module->norm->running_mean.clone();
  torch::manual_seed(3);
  const auto next_random = torch::rand({4});
  torch::manual_seed(3);
  const auto options = ckpt::CheckpointOptions().policy(ckpt::save_names({"h"}));
  CKPT_EXPECT_THROWS_WITH(ckpt::checkpoint(options, module, input),
                          "the name \"h\" was given twice in one selectively checkpointed region");
  CKPT_EXPECT_THROWS_WITH(ckpt::checkpoint(options, module, input), "a name of its own");
  EXPECT_TRUE(at::GradMode::is_enabled());
  EXPECT_TRUE(bit_equal(module->norm->running_mean, mean_before));
  EXPECT_TRUE(bit_equal(torch::rand({4}), next_random));
  const auto t = torch::ones({2});
  EXPECT_TRUE(ckpt::checkpoint_name(t, "t").is_same(t));
  module->twice = false;
  ckpt::checkpoint(options, module, input).sum().backward();
  EXPECT_TRUE(input.grad().defined());
}

// MustSave (save_names) on a tensor that cannot be kept says why.
TEST(CheckpointNameTest, ANamedTensorThatCannotBeKeptIsAClearError) {
  const auto input = torch::randn({4}, torch::requires_grad());
  const auto options = ckpt::CheckpointOptions().policy(ckpt::save_names({"h"}));
  CKPT_EXPECT_THROWS_WITH(
      ckpt::checkpoint(
          options, [](const at::Tensor& x) { return ckpt::checkpoint_name(x, "h").sin(); }, input),
      "was not computed inside the region");
  CKPT_EXPECT_THROWS_WITH(ckpt::checkpoint(
                              options,
                              [](const at::Tensor& x) {
                                auto h = x.sin();
                                auto read = h.cos();  // read before the write: not absorbed
                                h.mul_(2);
                                return ckpt::checkpoint_name(h, "h").cos() + read;
                              },
                              input),
                          "written in place after aten::sin computed it");
  // PreferSave recomputes it instead.
  const auto prefer =
      ckpt::CheckpointOptions().policy(ckpt::SelectivePolicy([](const ckpt::OpCall& call) {
        return call.tensor_name() != nullptr ? ckpt::CheckpointPolicy::PreferSave
                                             : ckpt::CheckpointPolicy::PreferRecompute;
      }));
  auto y = ckpt::checkpoint(
      prefer, [](const at::Tensor& x) { return ckpt::checkpoint_name(x, "h").sin(); }, input);
  y.sum().backward();
  EXPECT_TRUE(bit_equal(input.grad(), input.detach().cos()));
}

}  // namespace names_test
