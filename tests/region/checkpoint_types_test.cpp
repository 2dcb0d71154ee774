// Arguments and results of every supported kind pass through ckpt::checkpoint unchanged, and
// every tensor among them that requires grad stays connected to autograd.

#include <ckpt/checkpoint.h>

#include "support/support.h"

namespace checkpoint_types_test {

using ckpt::test::bit_equal;
using ckpt::test::close;

struct CheckpointTypesTest : ckpt::test::SeedingFixture, ::testing::WithParamInterface<bool> {
  ckpt::CheckpointOptions options() const {
    return ckpt::CheckpointOptions().use_reentrant(GetParam());
  }
};

// Port of test_checkpoint_non_tensor_inputs_outputs (test_utils.py), both variants.
TEST_P(CheckpointTypesTest, NonTensorInputsAndOutputs) {
  auto foo = [](const torch::Tensor& t1, const torch::Tensor& t2, int64_t scale,
                const torch::Tensor& t3) {
    auto t4 = (t1 + t2 * t3) * scale;
    auto t5 = (t1 * t2 + t3) * scale;
    return std::make_tuple(scale, t4, c10::optional<torch::Tensor>(), true, t5, std::string("bar"),
                           t1);
  };
  auto t1 = torch::rand({10}, torch::requires_grad());
  auto t2 = torch::rand({10}, torch::requires_grad());
  auto t3 = torch::rand({10});
  const int64_t scale = torch::randint(0, 10, {1}).item<int64_t>();
  auto res = ckpt::checkpoint(options(), foo, t1, t2, scale, t3);
  EXPECT_EQ(std::get<0>(res), scale);
  EXPECT_TRUE(bit_equal(std::get<1>(res), (t1 + t2 * t3) * scale));
  EXPECT_FALSE(std::get<2>(res).has_value());
  EXPECT_TRUE(std::get<3>(res));
  EXPECT_TRUE(bit_equal(std::get<4>(res), (t1 * t2 + t3) * scale));
  EXPECT_EQ(std::get<5>(res), "bar");
  EXPECT_TRUE(bit_equal(std::get<6>(res), t1));

  std::get<1>(res).sum().backward({}, /*retain_graph=*/true);
  std::get<4>(res).sum().backward({}, /*retain_graph=*/true);
  std::get<6>(res).sum().backward();
  CKPT_EXPECT_THROWS_WITH(std::get<6>(res).sum().backward(), "second time");
  auto g1 = t1.grad().clone(), g2 = t2.grad().clone();

  t1.mutable_grad() = torch::Tensor();
  t2.mutable_grad() = torch::Tensor();
  auto plain = foo(t1, t2, scale, t3);
  torch::autograd::backward(
      {std::get<1>(plain).sum(), std::get<4>(plain).sum(), std::get<6>(plain).sum()});
  EXPECT_TRUE(bit_equal(g1, t1.grad()));
  EXPECT_TRUE(bit_equal(g2, t2.grad()));
}

// Port of test_checkpoint_no_tensors: no tensor at all goes in or out.
TEST_P(CheckpointTypesTest, NoTensors) {
  auto foo = [](double a, double b, int scale, double c) {
    return std::make_tuple((a + b * c) * scale, std::string("bar"));
  };
  auto [value, text] = ckpt::checkpoint(options(), foo, 0.5, 0.25, 3, 2.0);
  EXPECT_DOUBLE_EQ(value, (0.5 + 0.25 * 2.0) * 3);
  EXPECT_EQ(text, "bar");
}

// Port of test_checkpoint_non_tensor: an optional tensor argument that is empty.
TEST_P(CheckpointTypesTest, EmptyOptionalArgument) {
  auto run_fn = [](const torch::Tensor& t1, const c10::optional<torch::Tensor>& t2) {
    return t2.has_value() ? t1 + *t2 : t1 * 1;
  };
  auto x = torch::randn({1, 100}, torch::requires_grad());
  ckpt::checkpoint(options(), run_fn, x, c10::optional<torch::Tensor>()).sum().backward();
  EXPECT_TRUE(bit_equal(x.grad(), torch::ones({1, 100})));
  auto y = torch::randn({1, 100}, torch::requires_grad());
  ckpt::checkpoint(options(), run_fn, x, c10::optional<torch::Tensor>(y)).sum().backward();
  EXPECT_TRUE(bit_equal(y.grad(), torch::ones({1, 100})));
}

TEST_P(CheckpointTypesTest, VectorArgumentsAndVectorResult) {
  auto fn = [](const std::vector<torch::Tensor>& xs, torch::Tensor scale) {
    std::vector<torch::Tensor> out;
    for (const auto& x : xs) out.push_back(x.sin() * scale);
    out.push_back(torch::stack(xs).sum(0));
    return out;
  };
  std::vector<torch::Tensor> xs = {torch::randn({3}, torch::requires_grad()),
                                   torch::randn({3}, torch::requires_grad())};
  auto scale = torch::randn({3}, torch::requires_grad());
  auto loss = [](const std::vector<torch::Tensor>& out) {
    return out[0].sum() + 2 * out[1].sum() + 3 * out[2].pow(2).sum();
  };
  auto expected = torch::autograd::grad({loss(fn(xs, scale))}, {xs[0], xs[1], scale});
  auto out = ckpt::checkpoint(options(), fn, xs, scale);
  ASSERT_EQ(out.size(), 3u);
  loss(out).backward();
  EXPECT_TRUE(bit_equal(xs[0].grad(), expected[0]));
  EXPECT_TRUE(bit_equal(xs[1].grad(), expected[1]));
  EXPECT_TRUE(bit_equal(scale.grad(), expected[2]));
}

TEST_P(CheckpointTypesTest, ArgumentsByValueByReferenceAndPair) {
  auto fn = [](torch::Tensor by_value, const torch::Tensor& by_ref,
               std::pair<torch::Tensor, int> p) {
    return std::make_pair(by_value * by_ref + p.first * p.second, p.second);
  };
  auto a = torch::randn({4}, torch::requires_grad());
  auto b = torch::randn({4}, torch::requires_grad());
  auto c = torch::randn({4}, torch::requires_grad());
  auto [out, k] = ckpt::checkpoint(options(), fn, a, b, std::make_pair(c, 3));
  EXPECT_EQ(k, 3);
  out.sum().backward();
  EXPECT_TRUE(close(a.grad(), b.detach()));
  EXPECT_TRUE(close(b.grad(), a.detach()));
  EXPECT_TRUE(close(c.grad(), torch::full({4}, 3.0)));
}

TEST_P(CheckpointTypesTest, IntegerOutputsPassThroughWithoutGrad) {
  auto fn = [](const torch::Tensor& x) { return std::make_tuple(x * 2, x.argmax()); };
  auto x = torch::randn({5}, torch::requires_grad());
  auto [y, index] = ckpt::checkpoint(options(), fn, x);
  EXPECT_TRUE(y.requires_grad());
  EXPECT_FALSE(index.requires_grad());
  EXPECT_EQ(index.item<int64_t>(), x.argmax().item<int64_t>());
  y.sum().backward();
  EXPECT_TRUE(bit_equal(x.grad(), torch::full({5}, 2.0)));
}

TEST_P(CheckpointTypesTest, MutableLambdaAndCallableArguments) {
  int calls = 0;
  auto fn = [&calls](const torch::Tensor& x,
                     const std::function<torch::Tensor(torch::Tensor)>& f) mutable {
    ++calls;
    return f(x);
  };
  auto x = torch::randn({3}, torch::requires_grad());
  std::function<torch::Tensor(torch::Tensor)> square = [](torch::Tensor t) { return t * t; };
  ckpt::checkpoint(options(), fn, x, square).sum().backward();
  EXPECT_EQ(calls, 2);
  EXPECT_TRUE(close(x.grad(), 2 * x.detach()));
}

}  // namespace checkpoint_types_test

// A result of the user's own type, made visible through the documented customisation point.
namespace user {
struct Encoded {
  torch::Tensor mean;
  torch::Tensor log_variance;
  std::vector<torch::Tensor> skips;
  int64_t steps = 0;
};
auto ckpt_tensors(Encoded& encoded) {
  return std::tie(encoded.mean, encoded.log_variance, encoded.skips);
}
}  // namespace user

namespace checkpoint_types_test {

TEST_P(CheckpointTypesTest, StructResultWithCkptTensorsIsCheckpointed) {
  torch::nn::Linear linear(6, 6);
  auto encode = [&](const torch::Tensor& x) {
    user::Encoded out;
    auto h = torch::tanh(linear(x));
    out.mean = h * 2;
    out.log_variance = h.sin();
    out.skips = {h.cos(), h.exp()};
    out.steps = 3;
    return out;
  };
  auto loss = [](const user::Encoded& e) {
    return e.mean.sum() + e.log_variance.pow(2).sum() + e.skips[0].sum() * e.skips[1].mean();
  };
  auto x = torch::randn({4, 6}, torch::requires_grad());
  loss(encode(x)).backward();
  const std::vector<torch::Tensor> expected = {x.grad().clone(), linear->weight.grad().clone(),
                                               linear->bias.grad().clone()};
  for (auto* t : {&x, &linear->weight, &linear->bias}) t->mutable_grad() = torch::Tensor();

  const user::Encoded encoded = ckpt::checkpoint(options(), encode, x);
  EXPECT_EQ(encoded.steps, 3);
  // The outputs hang off the region's node, not off the region's own graph.
  for (const auto& out : {encoded.mean, encoded.skips[1]}) {
    ASSERT_TRUE(out.grad_fn());
    EXPECT_NE(out.grad_fn()->name().find("ckpt::CheckpointBackward"), std::string::npos);
  }
  loss(encoded).backward();
  EXPECT_TRUE(bit_equal(x.grad(), expected[0]));
  EXPECT_TRUE(bit_equal(linear->weight.grad(), expected[1]));
  EXPECT_TRUE(bit_equal(linear->bias.grad(), expected[2]));
}

// docs/user-types.md: a struct argument with ckpt_tensors counts as the region's input, so the
// reentrant variant, whose gradients flow only through inputs, differentiates through it too.
TEST_P(CheckpointTypesTest, StructArgumentWithCkptTensorsGetsGradients) {
  auto combine = [](const user::Encoded& e) { return (e.mean * e.log_variance.exp()).tanh(); };
  auto make = [] {
    user::Encoded e;
    e.mean = torch::randn({5}, torch::requires_grad());
    e.log_variance = torch::randn({5}, torch::requires_grad());
    return e;
  };
  const user::Encoded plain = make();
  user::Encoded checkpointed;
  checkpointed.mean = plain.mean.detach().clone().requires_grad_();
  checkpointed.log_variance = plain.log_variance.detach().clone().requires_grad_();
  combine(plain).sum().backward();
  ckpt::checkpoint(options(), combine, checkpointed).sum().backward();
  EXPECT_TRUE(bit_equal(checkpointed.mean.grad(), plain.mean.grad()));
  EXPECT_TRUE(bit_equal(checkpointed.log_variance.grad(), plain.log_variance.grad()));
}

INSTANTIATE_TEST_SUITE_P(Variants, CheckpointTypesTest, ::testing::Values(false, true),
                         ckpt::test::VariantName());

}  // namespace checkpoint_types_test
