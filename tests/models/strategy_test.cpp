// models/strategy.h: the one parser of strategy names and their forwards, shared by `ckpt train`,
// the benchmarks and the tests.

#include "strategy.h"

#include "support/support.h"

#include <ckpt/sequential.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

namespace strategy_test {

using ckpt::models::parse_strategy;
using ckpt::models::Strategy;

void expect_refused(const std::string& text, const std::string& message) {
  try {
    parse_strategy(text, 4);
    ADD_FAILURE() << text << " was accepted";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find(message), std::string::npos) << error.what();
  }
}

TEST(Strategy, EverySpellingParses) {
  EXPECT_EQ(parse_strategy("none", 4).kind, Strategy::Kind::None);
  const Strategy sequential = parse_strategy("sequential:3", 4);
  EXPECT_EQ(sequential.kind, Strategy::Kind::Sequential);
  EXPECT_EQ(sequential.segments, 3);
  EXPECT_FALSE(sequential.reentrant);
  EXPECT_EQ(sequential.text, "sequential:3");
  const Strategy reentrant = parse_strategy("sequential_reentrant:2", 4);
  EXPECT_EQ(reentrant.kind, Strategy::Kind::Sequential);
  EXPECT_TRUE(reentrant.reentrant);
  EXPECT_EQ(parse_strategy("selective", 4).segments, 4);  // every stage its own region
  EXPECT_EQ(parse_strategy("selective:2", 4).kind, Strategy::Kind::Selective);
  const Strategy offload = parse_strategy("offload", 4);
  EXPECT_EQ(offload.kind, Strategy::Kind::Offload);
  EXPECT_EQ(offload.segments, 4);  // every stage its own region
  EXPECT_EQ(offload.text, "offload");
  EXPECT_EQ(parse_strategy("offload:2", 4).segments, 2);
  EXPECT_TRUE(ckpt::models::checkpoint_options(offload).offload());
  EXPECT_FALSE(ckpt::models::checkpoint_options(sequential).offload());
  const Strategy budget = parse_strategy("budget:40%", 4);
  EXPECT_EQ(budget.kind, Strategy::Kind::Budget);
  EXPECT_TRUE(budget.budget.is_fraction());
  EXPECT_DOUBLE_EQ(budget.budget.fraction(), 0.4);
  EXPECT_TRUE(parse_strategy("budget:min", 4).budget.is_minimum());
}

TEST(Strategy, BadSpellingsSayWhatIsWrong) {
  expect_refused("sequential", "--strategy sequential:K needs a number of segments K");
  expect_refused("sequential:0", "--strategy sequential:K: K must be a positive integer");
  expect_refused("selective:5",
                 "--strategy selective:5: K must be between 1 and the number of "
                 "stages (4), but got 5");
  expect_refused("offload:5",
                 "--strategy offload:5: K must be between 1 and the number of stages (4)");
  expect_refused("offload:x", "--strategy offload:K: K must be a positive integer");
  expect_refused("budget:", "--strategy budget:B needs a budget");
  expect_refused("budget:150%", "(0, 100]");
  expect_refused("none:2", "unknown strategy 'none:2'");
  expect_refused("magic", "unknown strategy 'magic'");
}

// Each strategy's forward gives the plain chain's output and gradients, under the variant it
// names: the reentrant one trains no parameter of a first segment whose input needs no grad.
TEST(Strategy, ForwardsRunTheChainUnderTheirVariant) {
  torch::manual_seed(0);
  torch::nn::Sequential chain(torch::nn::Linear(8, 8), torch::nn::Tanh(), torch::nn::Linear(8, 8),
                              torch::nn::Tanh());
  const torch::Tensor x = torch::randn({4, 8});
  chain->forward(x).sum().backward();
  const std::vector<torch::Tensor> plain = ckpt::test::take_grads(*chain);
  for (const char* text : {"none", "sequential:2", "selective:2", "sequential_reentrant:2"}) {
    const Strategy strategy = parse_strategy(text, 4);
    const torch::Tensor y = ckpt::models::chain_forward(strategy, chain)(x);
    EXPECT_TRUE(ckpt::test::bit_equal(y, chain->forward(x))) << text;
    y.sum().backward();
    const std::vector<torch::Tensor> grads = ckpt::test::take_grads(*chain);
    for (size_t i = 0; i < plain.size(); ++i) {
      if (strategy.reentrant && i < 2) {  // the first Linear's weight and bias
        EXPECT_FALSE(grads[i].defined()) << text << ", gradient " << i;
      } else {
        EXPECT_TRUE(ckpt::test::bit_equal(grads[i], plain[i])) << text << ", gradient " << i;
      }
    }
  }
  EXPECT_THROW(ckpt::models::chain_forward(parse_strategy("budget:min", 4), chain),
               std::invalid_argument);
}

// Offloaded segments on host tensors: the region's error (nothing to offload to), not a copy.
// tests/cli runs them on the emulated device.
TEST(Strategy, OffloadOnTheHostIsRefused) {
  torch::nn::Sequential chain(torch::nn::Linear(8, 8), torch::nn::Tanh());
  const auto forward = ckpt::models::chain_forward(parse_strategy("offload", 2), chain);
  EXPECT_THROW(
      {
        try {
          forward(torch::randn({4, 8}));
        } catch (const c10::Error& error) {
          EXPECT_NE(std::string(error.what()).find("all in host memory already"), std::string::npos)
              << error.what();
          throw;
        }
      },
      c10::Error);
}

}  // namespace strategy_test
