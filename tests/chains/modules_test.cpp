// ckpt::Checkpointed and ckpt::apply_checkpointing: same gradients, same parameter and buffer
// names, state saved wrapped loads unwrapped and back.

#include <ckpt/modules.h>

#include "support/support.h"

#include <sstream>

namespace {

using ckpt::test::bit_equal;

struct ModulesTest : ckpt::test::SeedingFixture {};

// A module with a child of its own, so that wrapping has nested names to keep.
struct NestedImpl : torch::nn::Module {
  NestedImpl() : linear(register_module("linear", torch::nn::Linear(10, 10))) {}
  torch::Tensor forward(const torch::Tensor& x) { return torch::tanh(linear(x)); }
  torch::nn::Linear linear;
};
TORCH_MODULE(Nested);

torch::nn::Sequential make_model() {
  return torch::nn::Sequential(torch::nn::Linear(10, 10), torch::nn::BatchNorm1d(10),
                               torch::nn::ReLU(), Nested(), torch::nn::Linear(10, 3));
}

std::vector<std::string> keys(const torch::OrderedDict<std::string, torch::Tensor>& dict) {
  std::vector<std::string> out;
  for (const auto& item : dict) out.push_back(item.key());
  return out;
}

TEST_F(ModulesTest, WrapperKeepsNamesAndGradients) {
  torch::nn::Linear linear(6, 4);
  ckpt::Checkpointed wrapped(linear);
  EXPECT_EQ(keys(wrapped->named_parameters()), keys(linear->named_parameters()));
  auto x = torch::randn({5, 6}, torch::requires_grad());
  auto expected = torch::autograd::grad({linear(x).pow(2).sum()}, {x, linear->weight});
  auto actual = torch::autograd::grad({wrapped(x).pow(2).sum()}, {x, linear->weight});
  EXPECT_TRUE(bit_equal(actual[0], expected[0]));
  EXPECT_TRUE(bit_equal(actual[1], expected[1]));
  std::ostringstream printed;
  wrapped->pretty_print(printed);
  EXPECT_EQ(printed.str(), "ckpt::Checkpointed(use_reentrant=false, preserve_rng_state=true)");
}

// Port of test_apply_activation_checkpointing and test_fqn (test_checkpoint_wrapper.py).
TEST_F(ModulesTest, ApplyCheckpointingWrapsChosenChildrenAndKeepsNames) {
  torch::manual_seed(3);
  auto reference = make_model();
  torch::manual_seed(3);
  auto model = make_model();
  auto wrapped =
      ckpt::apply_checkpointing(model, [](const std::string&, const torch::nn::Module& m) {
        return dynamic_cast<const torch::nn::LinearImpl*>(&m) != nullptr ||
               dynamic_cast<const NestedImpl*>(&m) != nullptr;
      });
  int wrappers = 0;
  for (const auto& child : wrapped->children()) {
    wrappers += std::dynamic_pointer_cast<ckpt::CheckpointedImpl>(child) != nullptr;
  }
  EXPECT_EQ(wrappers, 3);
  EXPECT_EQ(keys(wrapped->named_parameters()), keys(model->named_parameters()));
  EXPECT_EQ(keys(wrapped->named_buffers()), keys(model->named_buffers()));

  auto x = torch::randn({8, 10}, torch::requires_grad());
  auto expected = torch::autograd::grad({reference->forward(x).sum()}, {x})[0];
  auto y = wrapped->forward(x);
  EXPECT_TRUE(y.requires_grad());
  y.sum().backward();
  EXPECT_TRUE(bit_equal(x.grad(), expected));
  for (const auto& p : model->parameters()) EXPECT_TRUE(p.grad().defined());
  // BatchNorm ran once per step in the wrapped model too.
  auto a = reference->named_buffers(), b = model->named_buffers();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(bit_equal(a[i].value(), b[i].value()));
}

// Port of test_load_activation_checkpointed_module: a state saved wrapped loads unwrapped and back.
TEST_F(ModulesTest, StateRoundTripsBetweenWrappedAndUnwrapped) {
  auto source = make_model();
  auto wrapped = ckpt::apply_checkpointing(
      source, [](const std::string& name, const torch::nn::Module&) { return name != "2"; });
  std::stringstream stream;
  torch::save(wrapped, stream);

  auto plain = make_model();  // different random weights
  torch::load(plain, stream);
  auto a = source->named_parameters(), b = plain->named_parameters();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(bit_equal(a[i].value(), b[i].value()));

  std::stringstream back;
  torch::save(plain, back);
  auto other = ckpt::apply_checkpointing(
      make_model(), [](const std::string&, const torch::nn::Module&) { return true; });
  torch::load(other, back);
  auto c = other->named_parameters();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(bit_equal(a[i].value(), c[i].value()));
}

TEST_F(ModulesTest, RejectsAnEmptyModule) {
  CKPT_EXPECT_THROWS_WITH(ckpt::Checkpointed(torch::nn::AnyModule()), "empty");
}

}  // namespace
