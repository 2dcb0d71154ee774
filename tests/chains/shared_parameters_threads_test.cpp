// Threads that share one model and run checkpointed steps at once: every gradient contribution
// reaches `.grad` exactly once, under each strategy. Weights and inputs are small integers, so
// every float sum is exact whatever order the threads add in, and a lost or doubled update shows as
// an exact mismatch.

#include <ckpt/checkpoint.h>
#include <ckpt/options.h>
#include <ckpt/plan/solvers.h>
#include <ckpt/planned_sequential.h>
#include <ckpt/sequential.h>

#include "support/support.h"

#include <functional>
#include <thread>
#include <vector>

namespace shared_parameters_threads_test {

using Step = std::function<torch::Tensor(const torch::Tensor&)>;

constexpr int kThreads = 4;
constexpr int kStepsPerThread = 8;
constexpr int kRepetitions = 100;

struct SharedParametersThreadsTest : ckpt::test::SeedingFixture {
  // Three Linear + ReLU layers with weights and biases in {-1, 0, 1}: with inputs in the same
  // range, every value and every accumulated gradient stays an integer below 2^24.
  SharedParametersThreadsTest() {
    for (int i = 0; i < 3; ++i) {
      chain->push_back(torch::nn::Linear(kWidth, kWidth));
      chain->push_back(torch::nn::ReLU());
    }
    const torch::NoGradGuard no_grad;
    for (auto& p : chain->parameters()) p.copy_(torch::randint(-1, 2, p.sizes()));
    input = torch::randint(-1, 2, {8, kWidth}, torch::kFloat);
  }

  // The gradients of `threads * steps` plain steps on the same input: one step's, times that.
  std::vector<torch::Tensor> expected_gradients() {
    for (auto& p : chain->parameters()) p.mutable_grad() = torch::Tensor();
    chain->forward(input.clone().requires_grad_()).sum().backward();
    std::vector<torch::Tensor> expected;
    for (auto& p : chain->parameters()) expected.push_back(p.grad() * (kThreads * kStepsPerThread));
    return expected;
  }

  // Runs `step` on every thread at once, starting from defined zero gradients (the in-place
  // accumulation path), and compares the accumulated gradients with `expected`, bit for bit.
  void expect_exact_accumulation(const Step& step) {
    const auto expected = expected_gradients();
    for (int repetition = 0; repetition < kRepetitions; ++repetition) {
      for (auto& p : chain->parameters()) p.mutable_grad() = torch::zeros_like(p);
      std::vector<std::thread> threads;
      for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([&] {
          for (int s = 0; s < kStepsPerThread; ++s) {
            step(input.clone().requires_grad_()).sum().backward();
          }
        });
      }
      for (auto& thread : threads) thread.join();
      const auto parameters = chain->parameters();
      for (size_t i = 0; i < parameters.size(); ++i) {
        ASSERT_TRUE(ckpt::test::bit_equal(parameters[i].grad(), expected[i]))
            << "parameter " << i << ", repetition " << repetition << ": off by "
            << (parameters[i].grad() - expected[i]).abs().sum().item<float>();
      }
    }
  }

  static constexpr int64_t kWidth = 128;
  torch::nn::Sequential chain;
  torch::Tensor input;
};

TEST_F(SharedParametersThreadsTest, NonReentrantCheckpoint) {
  expect_exact_accumulation([this](const torch::Tensor& x) { return ckpt::checkpoint(chain, x); });
}

TEST_F(SharedParametersThreadsTest, ReentrantCheckpoint) {
  const auto reentrant = ckpt::CheckpointOptions().use_reentrant(true);
  expect_exact_accumulation(
      [&](const torch::Tensor& x) { return ckpt::checkpoint(reentrant, chain, x); });
}

TEST_F(SharedParametersThreadsTest, CheckpointSequential) {
  expect_exact_accumulation(
      [this](const torch::Tensor& x) { return ckpt::checkpoint_sequential(chain, 3, x); });
}

TEST_F(SharedParametersThreadsTest, PlannedSequential) {
  // At the smallest feasible budget, so that stages are recomputed. Profiling measures the whole
  // process: plan before the threads start.
  // Activations only: this chain's parameter gradients would outweigh its activations.
  const auto options = ckpt::PlannedSequentialOptions().count_parameter_gradients(false);
  ckpt::PlannedSequential probe(chain, ckpt::Budget::fraction(1.0), options);
  probe->plan(input.detach().requires_grad_());  // as the threads' inputs
  ckpt::PlannedSequential planned(
      chain, ckpt::Budget::bytes(ckpt::plan::min_feasible_budget_bytes(probe->profile())), options);
  planned->plan(input.detach().requires_grad_());
  ASSERT_GT(planned->prediction().forward_count, static_cast<int>(chain->size()));
  expect_exact_accumulation([&](const torch::Tensor& x) { return planned(x); });
}

}  // namespace shared_parameters_threads_test
