// ckpt::Checkpointed and ckpt::apply_checkpointing: same gradients, same parameter and buffer
// names, state saved wrapped loads unwrapped and back.

#include <ckpt/modules.h>
#include <ckpt/planned_sequential.h>
#include <ckpt/sequential.h>

#include "support/support.h"

#include <sstream>

namespace modules_test {

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
  const auto parameter_names = keys(model->named_parameters());
  const auto buffer_names = keys(model->named_buffers());
  ckpt::apply_checkpointing(*model, [](const std::string&, const torch::nn::Module& m) {
    return dynamic_cast<const torch::nn::LinearImpl*>(&m) != nullptr ||
           dynamic_cast<const NestedImpl*>(&m) != nullptr;
  });
  int wrappers = 0;
  for (const auto& child : model->children())
    wrappers += child->as<ckpt::CheckpointedBase>() != nullptr;
  EXPECT_EQ(wrappers, 3);
  EXPECT_EQ(keys(model->named_parameters()), parameter_names);
  EXPECT_EQ(keys(model->named_buffers()), buffer_names);
  auto wrapped = model;

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
  ckpt::apply_checkpointing(
      *source, [](const std::string& name, const torch::nn::Module&) { return name != "2"; });
  std::stringstream stream;
  torch::save(source, stream);

  auto plain = make_model();  // different random weights
  torch::load(plain, stream);
  auto a = source->named_parameters(), b = plain->named_parameters();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(bit_equal(a[i].value(), b[i].value()));

  std::stringstream back;
  torch::save(plain, back);
  auto other = make_model();
  ckpt::apply_checkpointing(*other,
                            [](const std::string&, const torch::nn::Module&) { return true; });
  torch::load(other, back);
  auto c = other->named_parameters();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(bit_equal(a[i].value(), c[i].value()));
}

TEST_F(ModulesTest, RejectsAnEmptyModule) {
  CKPT_EXPECT_THROWS_WITH(ckpt::Checkpointed(torch::nn::AnyModule()), "empty");
}

std::vector<torch::Tensor> buffers_of(const torch::nn::Module& module) {
  std::vector<torch::Tensor> out;
  for (const auto& buffer : module.buffers()) out.push_back(buffer.clone());
  return out;
}

void expect_same_buffers(const torch::nn::Module& a, const torch::nn::Module& b) {
  const auto x = buffers_of(a), y = buffers_of(b);
  ASSERT_EQ(x.size(), y.size());
  for (size_t i = 0; i < x.size(); ++i) EXPECT_TRUE(bit_equal(x[i], y[i])) << "buffer " << i;
}

torch::nn::Sequential make_layer_group() {
  torch::manual_seed(5);
  return torch::nn::Sequential(torch::nn::Linear(6, 6), torch::nn::BatchNorm1d(6),
                               torch::nn::ReLU(), torch::nn::Linear(6, 6));
}

// Issue 11, item 1: checkpoint(layer_group, x) used to move BatchNorm's statistics twice.
TEST_F(ModulesTest, CheckpointOfAModuleMovesBatchNormStatisticsOnce) {
  for (const bool reentrant : {false, true}) {
    const auto options = ckpt::CheckpointOptions().use_reentrant(reentrant);
    auto reference = make_layer_group();
    auto as_function = make_layer_group();
    auto as_argument = make_layer_group();
    auto x = torch::randn({8, 6}, torch::requires_grad());
    reference->forward(x).pow(2).sum().backward();
    ckpt::checkpoint(options, as_function, x).pow(2).sum().backward();
    ckpt::checkpoint(
        options, [](const torch::Tensor& t, torch::nn::Sequential& m) { return m->forward(t); }, x,
        as_argument)
        .pow(2)
        .sum()
        .backward();
    for (auto* model : {&as_function, &as_argument}) {
      expect_same_buffers(**model, *reference);
      EXPECT_EQ((*model)[1]->as<torch::nn::BatchNorm1d>()->num_batches_tracked.item<int64_t>(), 1);
      const auto expected = reference->parameters(), actual = (*model)->parameters();
      for (size_t i = 0; i < actual.size(); ++i) {
        EXPECT_TRUE(bit_equal(actual[i].grad(), expected[i].grad())) << "parameter " << i;
      }
    }
  }
}

// Issue 11, item 1: Checkpointed(Sequential) did not compile (AnyModule's static assertion).
TEST_F(ModulesTest, CheckpointedWrapsASequentialAndMovesItsStatisticsOnce) {
  auto reference = make_layer_group();
  auto inner = make_layer_group();
  ckpt::Checkpointed block(inner);
  EXPECT_EQ(keys(block->named_parameters()), keys(reference->named_parameters()));
  auto x = torch::randn({8, 6}, torch::requires_grad());
  auto expected = torch::autograd::grad({reference->forward(x).pow(2).sum()}, {x})[0];
  auto actual = torch::autograd::grad({block(x).pow(2).sum()}, {x})[0];
  EXPECT_TRUE(bit_equal(actual, expected));
  expect_same_buffers(*block, *reference);
  // It is a module like any other: it goes into a Sequential.
  torch::nn::Sequential outer(torch::nn::Linear(6, 6), block);
  EXPECT_EQ(outer->forward(x).sizes(), x.sizes());
}

// Issue 11, item 6: Checkpointed(lstm) compiled, then failed at the first forward.
TEST_F(ModulesTest, CheckpointedKeepsTheArgumentsAndResultsOfItsModule) {
  torch::nn::LSTM lstm(torch::nn::LSTMOptions(4, 5).num_layers(2));
  ckpt::Checkpointed wrapped(lstm);
  auto x = torch::randn({7, 3, 4}, torch::requires_grad());
  auto h = torch::randn({2, 3, 5}, torch::requires_grad());
  auto c = torch::randn({2, 3, 5});
  auto loss = [](const std::tuple<torch::Tensor, std::tuple<torch::Tensor, torch::Tensor>>& out) {
    return std::get<0>(out).pow(2).sum() + std::get<0>(std::get<1>(out)).sum() +
           std::get<1>(std::get<1>(out)).mean();
  };
  const std::vector<torch::Tensor> wrt = {x, h, lstm->parameters()[0]};
  auto expected = torch::autograd::grad({loss(lstm(x, std::make_tuple(h, c)))}, wrt);
  std::tuple<torch::Tensor, std::tuple<torch::Tensor, torch::Tensor>> out =
      wrapped(x, std::make_tuple(h, c));
  auto actual = torch::autograd::grad({loss(out)}, wrt);
  for (size_t i = 0; i < wrt.size(); ++i) EXPECT_TRUE(bit_equal(actual[i], expected[i]));
}

// Issue 11, item 4: eval() did not reach the wrapped Dropout, and clone() threw.
TEST_F(ModulesTest, CheckpointedFollowsTrainEvalToAndClone) {
  ckpt::Checkpointed dropout(torch::nn::Dropout(0.5));
  auto x = torch::ones({100});
  dropout->eval();
  EXPECT_FALSE(dropout->wrapped()->is_training());
  EXPECT_TRUE(bit_equal(dropout(x), x));
  dropout->train();
  EXPECT_TRUE(dropout->wrapped()->is_training());
  EXPECT_FALSE(torch::equal(dropout(x), x));

  ckpt::Checkpointed block(make_layer_group());
  auto copy =
      std::dynamic_pointer_cast<ckpt::CheckpointedImpl<torch::nn::SequentialImpl>>(block->clone());
  ASSERT_TRUE(copy);
  const auto original = block->named_parameters(), cloned = copy->named_parameters();
  EXPECT_EQ(keys(cloned), keys(original));
  for (size_t i = 0; i < original.size(); ++i) {
    EXPECT_TRUE(bit_equal(cloned[i].value(), original[i].value()));
    EXPECT_NE(cloned[i].value().data_ptr(), original[i].value().data_ptr());
  }
  auto y = torch::randn({4, 6});
  block->eval();
  copy->eval();
  EXPECT_TRUE(bit_equal(copy->forward(y), block(y)));

  block->to(torch::kDouble);
  for (const auto& p : block->wrapped()->parameters()) EXPECT_EQ(p.scalar_type(), torch::kDouble);
  EXPECT_EQ(block(y.to(torch::kDouble)).scalar_type(), torch::kDouble);
}

// A hostile probe: a model that holds `Checkpointed` members (the pattern docs/limits.md shows)
// and is `Cloneable` cloned into fresh weights and reset BatchNorm statistics, silently:
// LibTorch's Cloneable builds the members again in reset() and then asks each to copy the
// original's, which the wrapper did not do.
struct ClonedNetImpl : torch::nn::Cloneable<ClonedNetImpl> {
  ClonedNetImpl() { reset(); }
  void reset() override {
    linear = register_module("linear", ckpt::Checkpointed(torch::nn::Linear(6, 6)));
    norm = register_module("norm", ckpt::Checkpointed(torch::nn::BatchNorm1d(6)));
  }
  torch::Tensor forward(const torch::Tensor& x) { return norm(linear(x)); }
  ckpt::Checkpointed<torch::nn::LinearImpl> linear{nullptr};
  ckpt::Checkpointed<torch::nn::BatchNorm1dImpl> norm{nullptr};
};
TORCH_MODULE(ClonedNet);

TEST_F(ModulesTest, ACloneableModelCopiesItsCheckpointedMembers) {
  ClonedNet net;
  net->forward(torch::randn({8, 6})).sum().backward();  // moves the statistics
  const auto copy = std::dynamic_pointer_cast<ClonedNetImpl>(net->clone());
  ASSERT_TRUE(copy);
  for (const auto& [original, cloned] :
       {std::pair{net->named_parameters(), copy->named_parameters()},
        std::pair{net->named_buffers(), copy->named_buffers()}}) {
    ASSERT_EQ(keys(cloned), keys(original));
    for (size_t i = 0; i < original.size(); ++i) {
      EXPECT_TRUE(bit_equal(cloned[i].value(), original[i].value())) << original[i].key();
      EXPECT_NE(cloned[i].value().data_ptr(), original[i].value().data_ptr());
    }
  }
  const auto y = torch::randn({4, 6});
  net->eval();
  copy->eval();
  EXPECT_TRUE(bit_equal(copy->forward(y), net->forward(y)));
}

// Issue 11, item 6: a const Sequential& did not compile.
TEST_F(ModulesTest, ConstSequentialWorksEverywhere) {
  const torch::nn::Sequential& model = make_layer_group();
  auto x = torch::randn({8, 6}, torch::requires_grad());
  EXPECT_EQ(ckpt::checkpoint(model, x).sizes(), x.sizes());
  EXPECT_EQ(ckpt::checkpoint_sequential(model, 2, x).sizes(), x.sizes());
  ckpt::Checkpointed wrapped(model);
  EXPECT_EQ(wrapped(x).sizes(), x.sizes());
  ckpt::PlannedSequential planned(model, ckpt::Budget::parse("min"));
  EXPECT_EQ(planned(x).sizes(), x.sizes());
}

// A model written the usual way: members the forward calls, and a Sequential body.
struct TowerImpl : torch::nn::Module {
  TowerImpl()
      : stem(register_module("stem", torch::nn::Linear(6, 8))),
        body(register_module(
            "body", torch::nn::Sequential(torch::nn::Linear(8, 10), torch::nn::BatchNorm1d(10),
                                          torch::nn::Tanh(), Nested()))),
        head(register_module("head", torch::nn::Linear(10, 2))) {}
  torch::Tensor forward(const torch::Tensor& x) { return head(body->forward(stem(x))); }
  torch::nn::Linear stem;
  torch::nn::Sequential body;
  torch::nn::Linear head;
};
TORCH_MODULE(Tower);

// Issue 11, item 6: apply_checkpointing took only a Sequential.
TEST_F(ModulesTest, ApplyCheckpointingWalksAModuleTreeInPlace) {
  torch::manual_seed(9);
  Tower reference;
  torch::manual_seed(9);
  Tower model;
  const auto names = keys(model->named_parameters());
  std::vector<std::string> seen;
  ckpt::apply_checkpointing(*model, [&](const std::string& name, const torch::nn::Module&) {
    seen.push_back(name);
    return name == "body.0" || name == "body.3";
  });
  // The walk asks about the whole tree, inside matches too, so that a nested match is named.
  EXPECT_EQ(seen, (std::vector<std::string>{"stem", "body", "body.0", "body.1", "body.2", "body.3",
                                            "body.3.linear", "head"}));
  EXPECT_TRUE(model->body[0]->as<ckpt::CheckpointedBase>());
  EXPECT_TRUE(model->body[3]->as<ckpt::CheckpointedBase>());
  EXPECT_FALSE(model->body[1]->as<ckpt::CheckpointedBase>());
  EXPECT_EQ(keys(model->named_parameters()), names);

  auto x = torch::randn({5, 6}, torch::requires_grad());
  auto expected = torch::autograd::grad({reference(x).pow(2).sum()}, {x})[0];
  auto actual = torch::autograd::grad({model(x).pow(2).sum()}, {x})[0];
  EXPECT_TRUE(bit_equal(actual, expected));
  expect_same_buffers(*model, *reference);
  // A second pass leaves what is checkpointed already alone.
  ckpt::apply_checkpointing(
      *model, [](const std::string& name, const torch::nn::Module&) { return name == "body.0"; });
  EXPECT_FALSE(
      model->body[0]->as<ckpt::CheckpointedBase>()->wrapped()->as<ckpt::CheckpointedBase>());
}

TEST_F(ModulesTest, ApplyCheckpointingNamesAMatchItCannotSwapAndChangesNothing) {
  Tower model;
  CKPT_EXPECT_THROWS_WITH(
      ckpt::apply_checkpointing(*model,
                                [](const std::string& name, const torch::nn::Module&) {
                                  return name == "body.0" || name == "head";
                                }),
      "'head' (torch::nn::LinearImpl) matches, but it is a member of");
  EXPECT_FALSE(model->body[0]->as<ckpt::CheckpointedBase>());
}

// Issue 29, item 8: nested matches were left unwrapped silently, and a module registered twice
// made an optimizer update its parameters twice without a word.
TEST_F(ModulesTest, ApplyCheckpointingWarnsAboutNestedMatchesAndModulesRegisteredTwice) {
  torch::nn::Sequential net(Nested(), torch::nn::Linear(10, 10));
  {
    ckpt::test::WarningCapture warnings;
    ckpt::apply_checkpointing(*net, [](const std::string& name, const torch::nn::Module&) {
      return name == "0" || name == "0.linear";
    });
    EXPECT_TRUE(warnings.contains("'0.linear'")) << ::testing::PrintToString(warnings.messages);
    EXPECT_TRUE(warnings.contains("not wrapped again"));
  }
  struct TwiceImpl : torch::nn::Module {
    TwiceImpl() {
      chain = register_module("chain", torch::nn::Sequential(torch::nn::Linear(4, 4)));
      planned =
          register_module("planned", ckpt::PlannedSequential(chain, ckpt::Budget::parse("100%")));
    }
    torch::nn::Sequential chain{nullptr};
    ckpt::PlannedSequential planned{nullptr};
  };
  TwiceImpl twice;
  EXPECT_EQ(twice.parameters().size(), 4u);  // LibTorch lists the Linear's two tensors twice
  EXPECT_EQ(ckpt::distinct_parameters(twice).size(), 2u);
  ckpt::test::WarningCapture warnings;
  ckpt::apply_checkpointing(twice,
                            [](const std::string&, const torch::nn::Module&) { return false; });
  EXPECT_TRUE(warnings.contains("registered twice")) << ::testing::PrintToString(warnings.messages);
  EXPECT_TRUE(warnings.contains("distinct_parameters"));
}

}  // namespace modules_test
