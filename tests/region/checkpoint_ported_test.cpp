// Ports of PyTorch's checkpoint tests (test_autograd.py, test_utils.py) that need no other home:
// many regions in one graph, autocast, custom autograd functions, containers of tensors.

#include <ckpt/checkpoint.h>

#include "support/support.h"

#include <ATen/autocast_mode.h>

namespace checkpoint_ported_test {

using ckpt::test::bit_equal;
using ckpt::test::close;

struct PortedCheckpointTest : ckpt::test::SeedingFixture, ::testing::WithParamInterface<bool> {
  ckpt::CheckpointOptions options() const {
    return ckpt::CheckpointOptions().use_reentrant(GetParam());
  }
};

// Port of test_checkpointing / test_checkpointing_without_reentrant (fewer inputs: 300, not 2000).
TEST_P(PortedCheckpointTest, ManyRegionsInOneGraph) {
  torch::nn::Sequential module(torch::nn::Linear(10, 100), torch::nn::ReLU(),
                               torch::nn::Linear(100, 10));
  auto copy = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(module->clone());
  std::vector<torch::Tensor> feats, plain;
  for (int i = 0; i < 300; ++i) {
    auto data = torch::empty({1, 10}).uniform_().requires_grad_();
    feats.push_back(ckpt::checkpoint(options(), module, data));
    plain.push_back(copy->forward(data));
  }
  torch::stack(feats).mean().backward();
  torch::stack(plain).mean().backward();
  auto p1 = module->parameters(), p2 = copy->parameters();
  for (size_t i = 0; i < p1.size(); ++i) EXPECT_TRUE(close(p1[i].grad(), p2[i].grad()));
}

// Port of test_checkpointing_non_reentrant_autocast_cpu (run for both variants).
TEST_P(PortedCheckpointTest, AutocastStateIsReplayedDuringRecompute) {
  for (bool enabled : {true, false}) {
    int dtype_mismatches = 0;
    auto foo = [&](const torch::Tensor& x, const torch::Tensor& y, const torch::Tensor& z) {
      auto a = torch::mm(x, y);
      auto b = torch::mm(a, z);
      auto c = torch::mm(z, z);
      if (c.scalar_type() != (enabled ? torch::kBFloat16 : torch::kFloat)) ++dtype_mismatches;
      return a.sum() + b.sum() + c.to(torch::kFloat).sum();
    };
    auto x = torch::randn({3, 3}, torch::requires_grad());
    auto y = torch::randn({3, 3}, torch::requires_grad());
    auto z = torch::randn({3, 3}, torch::requires_grad());
    torch::Tensor loss;
    {
      ckpt::compat::set_autocast_enabled(c10::DeviceType::CPU, enabled);
      ckpt::compat::set_autocast_dtype(c10::DeviceType::CPU, torch::kBFloat16);
      loss = ckpt::checkpoint(options(), foo, x, y, z);
      ckpt::compat::set_autocast_enabled(c10::DeviceType::CPU, false);
      at::autocast::clear_cache();
    }
    loss.backward();  // outside autocast: the recompute must re-enter it
    EXPECT_EQ(dtype_mismatches, 0) << "enabled=" << enabled;
    EXPECT_TRUE(x.grad().defined());
    EXPECT_FALSE(ckpt::compat::autocast_enabled(c10::DeviceType::CPU));
  }
}

// A C++ custom autograd function inside a region.
struct MulSum : torch::autograd::Function<MulSum> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& y, const torch::Tensor& z) {
    auto w = x * y * z;
    auto out = w + w;
    ctx->save_for_backward({x, y, z, w, out});
    return out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    auto g = grads[0] * 2;
    return {g * saved[1] * saved[2], g * saved[0] * saved[2], g * saved[0] * saved[1]};
  }
};

// Adapted from test_checkpointing_without_reentrant_custom_function_works.
TEST_P(PortedCheckpointTest, CustomAutogradFunctionInsideTheRegion) {
  auto foo = [](const torch::Tensor& x, const torch::Tensor& y, const torch::Tensor& z) {
    return MulSum::apply(x * y * z, y * y * z, z * z);
  };
  auto x = torch::tensor(1.0, torch::requires_grad());
  auto y = torch::tensor(2.0, torch::requires_grad());
  auto z = torch::tensor(3.0, torch::requires_grad());
  auto expected = torch::autograd::grad({foo(x, y, z)}, {x, y, z});
  ckpt::checkpoint(options(), foo, x, y, z).backward();
  EXPECT_TRUE(close(x.grad(), expected[0]));
  EXPECT_TRUE(close(y.grad(), expected[1]));
  EXPECT_TRUE(close(z.grad(), expected[2]));
}

// Port of test_checkpointing_without_reentrant_correct_grad.
TEST_P(PortedCheckpointTest, CorrectGradThroughBackward) {
  auto a = torch::randn({2, 2}, torch::requires_grad());
  a.exp().sum().backward();
  auto expected = a.grad().clone();
  a.mutable_grad() = torch::Tensor();
  ckpt::checkpoint(
      options(), [](const torch::Tensor& t) { return t.exp(); }, a)
      .sum()
      .backward();
  EXPECT_TRUE(bit_equal(a.grad(), expected));
}

TEST(PortedNonReentrantTest, CorrectGradThroughAutogradGrad) {
  auto a = torch::randn({2, 2}, torch::requires_grad());
  auto expected = torch::autograd::grad({a.exp().sum()}, {a})[0];
  auto out = ckpt::checkpoint([](const torch::Tensor& t) { return t.exp(); }, a).sum();
  EXPECT_TRUE(bit_equal(torch::autograd::grad({out}, {a})[0], expected));
}

// Adapted from test_checkpointing_without_reentrant_arbitrary_input_output (dicts → std::map).
TEST(PortedNonReentrantTest, MapInputAndOutput) {
  torch::nn::Linear linear(torch::nn::LinearOptions(5, 5).bias(false));
  auto copy = std::dynamic_pointer_cast<torch::nn::LinearImpl>(linear->clone());
  auto model = [](torch::nn::Linear l) {
    return [l](const std::map<std::string, torch::Tensor>& input) mutable {
      return std::map<std::string, torch::Tensor>{{"result", l(input.at("tensor"))}};
    };
  };
  std::map<std::string, torch::Tensor> inp{{"tensor", torch::randn({5, 5})}};
  auto plain = model(torch::nn::Linear(copy))(inp).at("result");
  auto checkpointed = ckpt::checkpoint(model(linear), inp).at("result");
  EXPECT_TRUE(bit_equal(plain, checkpointed));
  plain.sum().backward();
  checkpointed.sum().backward();
  EXPECT_TRUE(bit_equal(linear->weight.grad(), copy->weight.grad()));
}

INSTANTIATE_TEST_SUITE_P(Variants, PortedCheckpointTest, ::testing::Values(false, true),
                         ckpt::test::VariantName());

}  // namespace checkpoint_ported_test
