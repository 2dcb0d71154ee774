// Issue 27, item 2: a module switched to eval() between the forward and the backward pass (a
// validation pass before the backward) is recomputed in the mode of the forward, so gradients and
// buffers stay the plain step's, for every variant and wrapper that sees the module. A function
// that captures the module out of ckpt's sight gets a clear error where the graph shows it.

#include <ckpt/ckpt.h>
#include <ckpt/modules.h>
#include <ckpt/planned_sequential.h>
#include <ckpt/sequential.h>

#include "support/support.h"

#include <functional>
#include <string>
#include <vector>

namespace training_mode_test {

using ckpt::test::bit_equal;
using ckpt::test::take_grads;

torch::nn::Sequential make_model() {
  return torch::nn::Sequential(
      torch::nn::Linear(16, 32), torch::nn::BatchNorm1d(32), torch::nn::Tanh(),
      torch::nn::Dropout(0.3), torch::nn::Linear(32, 16), torch::nn::BatchNorm1d(16),
      torch::nn::Tanh(), torch::nn::Dropout(0.3), torch::nn::Linear(16, 8));
}

// The training forward of `model` through `forward`, then `model->eval()` and a validation
// forward, then the backward; the model is back in training mode afterwards.
struct Step {
  torch::Tensor input_grad;
  std::vector<torch::Tensor> grads;
  std::vector<torch::Tensor> buffers;
};

Step run_step(torch::nn::Module& model,
              const std::function<torch::Tensor(const torch::Tensor&)>& forward) {
  torch::manual_seed(11);
  auto x = torch::randn({256, 16}).requires_grad_();
  auto loss = forward(x).pow(2).sum();
  model.eval();
  {
    const torch::NoGradGuard no_grad;
    forward(torch::randn({256, 16}));  // validation
  }
  loss.backward();
  model.train();
  Step step{x.grad(), take_grads(model), {}};
  for (const auto& buffer : model.buffers()) step.buffers.push_back(buffer.clone());
  return step;
}

void expect_same(const Step& actual, const Step& expected) {
  EXPECT_TRUE(bit_equal(actual.input_grad, expected.input_grad));
  ASSERT_EQ(actual.grads.size(), expected.grads.size());
  for (size_t i = 0; i < actual.grads.size(); ++i) {
    EXPECT_TRUE(bit_equal(actual.grads[i], expected.grads[i])) << "parameter " << i;
  }
  ASSERT_EQ(actual.buffers.size(), expected.buffers.size());
  for (size_t i = 0; i < actual.buffers.size(); ++i) {
    EXPECT_TRUE(bit_equal(actual.buffers[i], expected.buffers[i])) << "buffer " << i;
  }
}

struct TrainingModeTest : ckpt::test::SeedingFixture {
  // The plain step on a fresh model with the seed's weights, and a second such model.
  Step plain() {
    torch::manual_seed(5);
    auto model = make_model();
    return run_step(*model, [&](const torch::Tensor& x) { return model->forward(x); });
  }
  torch::nn::Sequential model() {
    torch::manual_seed(5);
    return make_model();
  }
};

TEST_F(TrainingModeTest, CheckpointOfTheModuleRecomputesInTheForwardsMode) {
  const Step expected = plain();
  for (const auto& options :
       {ckpt::CheckpointOptions(), ckpt::CheckpointOptions().use_reentrant(true),
        ckpt::CheckpointOptions().policy(ckpt::save_matmuls())}) {
    SCOPED_TRACE(options.use_reentrant() ? "reentrant"
                 : options.policy()      ? "selective"
                                         : "default");
    auto net = model();
    expect_same(
        run_step(*net, [&](const torch::Tensor& x) { return ckpt::checkpoint(options, net, x); }),
        expected);
    EXPECT_TRUE(net->is_training());
  }
}

TEST_F(TrainingModeTest, ModuleArgumentOfAFunctionIsRecomputedInTheForwardsMode) {
  const Step expected = plain();
  auto net = model();
  expect_same(
      run_step(*net,
               [&](const torch::Tensor& x) {
                 return ckpt::checkpoint(
                     [](torch::nn::Sequential m, const torch::Tensor& t) { return m->forward(t); },
                     net, x);
               }),
      expected);
}

TEST_F(TrainingModeTest, CheckpointSequentialRecomputesInTheForwardsMode) {
  const Step expected = plain();
  for (const bool reentrant : {false, true}) {
    auto net = model();
    const auto options = ckpt::CheckpointOptions().use_reentrant(reentrant);
    expect_same(run_step(*net,
                         [&](const torch::Tensor& x) {
                           return ckpt::checkpoint_sequential(net, 3, x, options);
                         }),
                expected);
  }
}

TEST_F(TrainingModeTest, CheckpointedAndApplyCheckpointingRecomputeInTheForwardsMode) {
  const Step expected = plain();
  auto net = model();
  ckpt::Checkpointed wrapped(net);
  expect_same(run_step(*wrapped, [&](const torch::Tensor& x) { return wrapped->forward(x); }),
              expected);

  auto tree = model();
  ckpt::apply_checkpointing(*tree, [](const std::string& name, const torch::nn::Module&) {
    return name == "1" || name == "3" || name == "5";
  });
  expect_same(run_step(*tree, [&](const torch::Tensor& x) { return tree->forward(x); }), expected);
}

TEST_F(TrainingModeTest, PlannedSequentialRecomputesInTheForwardsMode) {
  const Step expected = plain();
  auto net = model();
  ckpt::PlannedSequential planned(
      net, ckpt::Budget::minimum(),
      ckpt::PlannedSequentialOptions().count_parameter_gradients(false));
  planned->plan(torch::randn({256, 16}).requires_grad_());  // as run_step's input
  ASSERT_GT(planned->prediction().forward_count, static_cast<int>(net->size()));
  expect_same(run_step(*planned, [&](const torch::Tensor& x) { return planned(x); }), expected);
}

// A lambda that captures the module hides it from ckpt: the recompute runs Dropout in eval mode,
// which builds another graph, and the region says so instead of returning wrong gradients.
TEST_F(TrainingModeTest, HiddenModuleSwitchedToEvalIsAClearError) {
  auto net = model();
  auto x = torch::randn({256, 16}).requires_grad_();
  auto loss = ckpt::checkpoint([&](const torch::Tensor& t) { return net->forward(t); }, x).sum();
  net->eval();
  CKPT_EXPECT_THROWS_WITH(loss.backward(), "train() and eval()");
  net->train();
}

}  // namespace training_mode_test
