// ckpt::DataParallel and ckpt::ProcessGroup (src/distributed): ranks run as processes on the
// loopback (ranks.h). After K steps, N ranks hold the parameters of one process trained on the
// whole batch, under every checkpointing strategy; each parameter is reduced once per step.

#include "ranks.h"
#include "strategy.h"

#include <ckpt/checkpoint.h>
#include <ckpt/distributed.h>
#include <ckpt/modules.h>
#include <ckpt/planned_sequential.h>
#include <ckpt/selective.h>
#include <ckpt/sequential.h>

#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <csignal>
#include <functional>
#include <map>
#include <string>

namespace data_parallel_test {

using ckpt::test::describe;
using ckpt::test::free_port;
using ckpt::test::run_ranks;

constexpr auto kDeadline = std::chrono::seconds(120);  // a whole test, far above its usual time
constexpr int64_t kGlobalBatch = 12;                   // divisible by 2 and by 3
constexpr int64_t kSteps = 4;

// The output layer multiplies by the input layer's weight: a tied weight, registered in both.
struct TiedOutputImpl : torch::nn::Module {
  explicit TiedOutputImpl(torch::Tensor tied) { weight = register_parameter("weight", tied); }
  torch::Tensor forward(const torch::Tensor& h) { return torch::matmul(h, weight); }
  torch::Tensor weight;
};
TORCH_MODULE(TiedOutput);

// input -> tanh -> shared -> tanh -> shared (the same Linear again) -> tanh -> tied output.
torch::nn::Sequential make_model() {
  torch::manual_seed(7);
  torch::nn::Linear input(6, 16);
  torch::nn::Linear shared(16, 16);
  return torch::nn::Sequential(input, torch::nn::Tanh(), shared, torch::nn::Tanh(), shared,
                               torch::nn::Tanh(), TiedOutput(input->weight));
}

std::pair<torch::Tensor, torch::Tensor> global_batch(int64_t step) {
  torch::manual_seed(100 + step);
  return {torch::randn({kGlobalBatch, 6}), torch::randn({kGlobalBatch, 6})};
}

using Forward = std::function<torch::Tensor(const torch::Tensor&)>;

// The strategies that are the program's (`ckpt train --strategy`), by their spelling there.
const std::map<std::string, std::string> kProgramStrategies = {
    {"none", "none"}, {"sequential", "sequential:3"}, {"planned", "budget:min"}};

// How each strategy of the test's own runs the model. "checkpoint" puts the shared Linear in two
// regions and the tied weight in a region and outside; "reentrant" keeps each parameter in one
// region.
Forward strategy_forward(const std::string& strategy, const torch::nn::Sequential& holder) {
  const std::shared_ptr<torch::nn::SequentialImpl> model = holder.ptr();
  const auto range = [model](size_t begin, size_t end) {
    return [model, begin, end](const torch::Tensor& input) {
      torch::Tensor x = input;
      for (size_t i = begin; i < end; ++i) x = model->begin()[i].forward(x);
      return x;
    };
  };
  if (strategy == "checkpoint") {
    return [range](const torch::Tensor& x) {
      const torch::Tensor h = ckpt::checkpoint(range(0, 4), x);
      return ckpt::checkpoint(range(4, 7), h);
    };
  }
  if (strategy == "reentrant") {
    const auto options = ckpt::CheckpointOptions().use_reentrant(true);
    return [range, options](const torch::Tensor& x) {
      const torch::Tensor h = range(0, 2)(x);  // the input layer, outside: it has no grad input
      return range(6, 7)(ckpt::checkpoint(options, range(2, 6), h));
    };
  }
  if (strategy == "reentrant_shared") {
    const auto options = ckpt::CheckpointOptions().use_reentrant(true);
    return [range, options](const torch::Tensor& x) {
      const torch::Tensor h = ckpt::checkpoint(options, range(2, 4), range(0, 2)(x));
      return range(6, 7)(ckpt::checkpoint(options, range(4, 6), h));
    };
  }
  if (strategy == "selective") {
    const auto options = ckpt::CheckpointOptions().policy(ckpt::save_matmuls());
    return [range, options](const torch::Tensor& x) {
      return ckpt::checkpoint(options, range(0, 7), x);
    };
  }
  throw std::invalid_argument("unknown strategy " + strategy);
}

// The model a strategy trains: Checkpointed and PlannedSequential wrap the chain.
struct Trained {
  torch::nn::Sequential chain = make_model();
  std::shared_ptr<torch::nn::Module> root;
  Forward forward;
};

Trained make_trained(const std::string& strategy, const torch::Tensor& sample) {
  Trained trained;
  if (strategy == "checkpointed") {
    // Each Linear (the shared one twice) in a Checkpointed wrapper of its own.
    ckpt::apply_checkpointing(*trained.chain, [](const std::string&, const torch::nn::Module& m) {
      return m.as<torch::nn::LinearImpl>() != nullptr;
    });
    trained.root = trained.chain.ptr();
    trained.forward = [chain = trained.chain](const torch::Tensor& x) mutable {
      return chain->forward(x);
    };
    return trained;
  }
  const auto program = kProgramStrategies.find(strategy);
  if (program == kProgramStrategies.end()) {
    trained.root = trained.chain.ptr();
    trained.forward = strategy_forward(strategy, trained.chain);
    return trained;
  }
  const auto parsed =
      ckpt::models::parse_strategy(program->second, static_cast<int64_t>(trained.chain->size()));
  if (parsed.kind == ckpt::models::Strategy::Kind::Budget) {
    ckpt::PlannedSequential planned(trained.chain, parsed.budget);
    planned->plan(sample);  // profiles (forward and backward) before any step
    for (auto& param : trained.chain->parameters()) param.mutable_grad().reset();
    trained.root = planned.ptr();
    trained.forward = [planned](const torch::Tensor& x) mutable { return planned->forward(x); };
  } else {
    trained.root = trained.chain.ptr();
    trained.forward = ckpt::models::chain_forward(parsed, trained.chain);
  }
  return trained;
}

torch::Tensor local_rows(const torch::Tensor& batch, int rank, int world) {
  const int64_t rows = kGlobalBatch / world;
  return batch.narrow(0, rank * rows, rows);
}

// One step of SGD on the mean squared error of `x`'s rows.
void sgd_step(const Forward& forward, torch::optim::SGD& optimizer, const torch::Tensor& x,
              const torch::Tensor& y) {
  optimizer.zero_grad();
  torch::nn::functional::mse_loss(forward(x), y).backward();
  optimizer.step();
}

// Runs as one rank: K data-parallel steps, then the same K steps in this process alone on the
// whole batch without checkpointing; throws when the parameters differ or a reduction count is
// not 1.
void train_and_compare(const std::string& strategy, int rank, int world, int port) {
  const auto group = ckpt::ProcessGroup::join(
      ckpt::RendezvousOptions().rank(rank).world_size(world).master_port(port).timeout(
          std::chrono::seconds(30)));
  Trained trained = make_trained(strategy, local_rows(global_batch(0).first, rank, world));
  ckpt::DataParallel parallel(trained.root, group);
  const auto params = trained.chain->parameters();
  torch::optim::SGD optimizer(params, torch::optim::SGDOptions(0.1));
  for (int64_t step = 0; step < kSteps; ++step) {
    const auto batch = global_batch(step);
    parallel.begin_step();
    sgd_step(trained.forward, optimizer, local_rows(batch.first, rank, world),
             local_rows(batch.second, rank, world));
    for (const int64_t count : parallel.reductions()) {
      TORCH_CHECK(count == 1, "step ", step, ": a parameter was reduced ", count, " times");
    }
  }
  torch::nn::Sequential alone = make_model();
  torch::optim::SGD alone_optimizer(alone->parameters(), torch::optim::SGDOptions(0.1));
  const Forward plain = [&alone](const torch::Tensor& x) { return alone->forward(x); };
  for (int64_t step = 0; step < kSteps; ++step) {
    const auto batch = global_batch(step);
    sgd_step(plain, alone_optimizer, batch.first, batch.second);
  }
  const auto expected = alone->named_parameters();
  for (const auto& item : trained.chain->named_parameters()) {
    const torch::Tensor& theirs = expected[item.key()];
    TORCH_CHECK(torch::allclose(item.value(), theirs, /*rtol=*/1e-6, /*atol=*/1e-6), "rank ", rank,
                ", ", strategy, ": parameter ", item.key(), " differs from one process by ",
                (item.value() - theirs).abs().max().item<float>());
  }
}

struct Case {
  std::string strategy;
  int world;
};

class DataParallelMatchesOneProcess : public testing::TestWithParam<Case> {};

TEST_P(DataParallelMatchesOneProcess, AfterSeveralSteps) {
  const Case c = GetParam();
  const int port = free_port();
  const auto outcomes = run_ranks(
      c.world, [&](int rank) { train_and_compare(c.strategy, rank, c.world, port); }, kDeadline);
  for (const auto& outcome : outcomes) ASSERT_TRUE(outcome.ok()) << describe(outcomes);
}

std::vector<Case> cases() {
  std::vector<Case> result;
  for (const char* strategy :
       {"none", "checkpoint", "reentrant", "sequential", "checkpointed", "planned", "selective"}) {
    for (int world : {2, 3}) result.push_back({strategy, world});
  }
  return result;
}

INSTANTIATE_TEST_SUITE_P(Strategies, DataParallelMatchesOneProcess, testing::ValuesIn(cases()),
                         [](const testing::TestParamInfo<Case>& test) {
                           return test.param.strategy + "_" + std::to_string(test.param.world) +
                                  "_ranks";
                         });

// ~~~ find_unused_parameters: a branch taken in some steps only ~~~

namespace unused {

// A chain, and a branch added to its output in even steps only.
struct BranchyImpl : torch::nn::Module {
  BranchyImpl() {
    torch::manual_seed(11);
    chain =
        register_module("chain", torch::nn::Sequential(torch::nn::Linear(6, 16), torch::nn::Tanh(),
                                                       torch::nn::Linear(16, 6)));
    branch = register_module("branch", torch::nn::Linear(6, 6));
  }
  torch::Tensor forward(const std::string& strategy, const torch::Tensor& x, bool with_branch) {
    const auto plain = [this, with_branch](const torch::Tensor& input) {
      const torch::Tensor y = chain->forward(input);
      return with_branch ? y + branch(input) : y;
    };
    if (strategy == "none") return plain(x);
    if (strategy == "checkpoint") return ckpt::checkpoint(plain, x);
    if (strategy == "selective") {
      return ckpt::checkpoint(ckpt::CheckpointOptions().policy(ckpt::save_matmuls()), plain, x);
    }
    const torch::Tensor y = ckpt::checkpoint_sequential(chain, 2, x);  // "sequential"
    return with_branch ? y + branch(x) : y;
  }
  torch::nn::Sequential chain{nullptr};
  torch::nn::Linear branch{nullptr};
};
TORCH_MODULE(Branchy);

// K steps data-parallel with find_unused_parameters, then alone on the whole batch: the same
// parameters, and each parameter reduced once per step.
void train_and_compare(const std::string& strategy, int rank, int world, int port) {
  const auto group = ckpt::ProcessGroup::join(
      ckpt::RendezvousOptions().rank(rank).world_size(world).master_port(port).timeout(
          std::chrono::seconds(30)));
  Branchy model;
  ckpt::DataParallel parallel(model.ptr(), group,
                              ckpt::DataParallelOptions().find_unused_parameters(true));
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
  for (int64_t step = 0; step < kSteps; ++step) {
    const auto batch = global_batch(step);
    optimizer.zero_grad();
    parallel.begin_step();
    const torch::Tensor loss = torch::nn::functional::mse_loss(
        model->forward(strategy, local_rows(batch.first, rank, world), step % 2 == 0),
        local_rows(batch.second, rank, world));
    parallel.prepare_for_backward({loss});
    loss.backward();
    optimizer.step();
    for (const int64_t count : parallel.reductions()) {
      TORCH_CHECK(count == 1, "step ", step, ": a parameter was reduced ", count, " times");
    }
  }
  Branchy alone;
  torch::optim::SGD alone_optimizer(alone->parameters(), torch::optim::SGDOptions(0.1));
  for (int64_t step = 0; step < kSteps; ++step) {
    const auto batch = global_batch(step);
    alone_optimizer.zero_grad();
    torch::nn::functional::mse_loss(alone->forward("none", batch.first, step % 2 == 0),
                                    batch.second)
        .backward();
    alone_optimizer.step();
  }
  const auto expected = alone->named_parameters();
  for (const auto& item : model->named_parameters()) {
    const torch::Tensor& theirs = expected[item.key()];
    TORCH_CHECK(torch::allclose(item.value(), theirs, /*rtol=*/1e-6, /*atol=*/1e-6), "rank ", rank,
                ", ", strategy, ": parameter ", item.key(), " differs from one process by ",
                (item.value() - theirs).abs().max().item<float>());
  }
}

class FindUnusedParameters : public testing::TestWithParam<std::string> {};

TEST_P(FindUnusedParameters, BranchTakenInSomeStepsMatchesOneProcess) {
  const std::string strategy = GetParam();
  const int port = free_port();
  const auto outcomes = run_ranks(
      2, [&](int rank) { train_and_compare(strategy, rank, 2, port); }, kDeadline);
  for (const auto& outcome : outcomes) ASSERT_TRUE(outcome.ok()) << describe(outcomes);
}

INSTANTIATE_TEST_SUITE_P(Strategies, FindUnusedParameters,
                         testing::Values("none", "checkpoint", "sequential", "selective"));

// A branch that rank 0 takes and rank 1 does not: both get the same gradient for it, rank 0's
// divided by the world size (DistributedDataParallel's rule: an unused parameter contributes 0).
TEST(FindUnusedParametersAcrossRanks, BranchOfOneRankIsAveragedWithZeros) {
  const int port = free_port();
  const auto outcomes = run_ranks(
      2,
      [port](int rank) {
        const auto group = ckpt::ProcessGroup::join(
            ckpt::RendezvousOptions().rank(rank).world_size(2).master_port(port).timeout(
                std::chrono::seconds(30)));
        Branchy model;
        Branchy twin;  // the same weights (same seed), trained alone on rank 0's rows
        ckpt::DataParallel parallel(model.ptr(), group,
                                    ckpt::DataParallelOptions().find_unused_parameters(true));
        const auto batch = global_batch(0);
        const torch::Tensor x = local_rows(batch.first, rank, 2);
        const torch::Tensor y = local_rows(batch.second, rank, 2);
        parallel.begin_step();
        const torch::Tensor loss =
            torch::nn::functional::mse_loss(model->forward("checkpoint", x, rank == 0), y);
        parallel.prepare_for_backward({loss});
        loss.backward();
        torch::Tensor expected = torch::zeros_like(model->branch->weight);
        if (rank == 0) {
          torch::nn::functional::mse_loss(twin->forward("none", x, true), y).backward();
          expected = twin->branch->weight.grad() / 2;
        }
        group.all_reduce_sum(expected);  // rank 0's, on every rank
        TORCH_CHECK(torch::allclose(model->branch->weight.grad(), expected, 1e-6, 1e-7), "rank ",
                    rank, ": the branch's gradient is not rank 0's halved");
      },
      kDeadline);
  for (const auto& outcome : outcomes) ASSERT_TRUE(outcome.ok()) << describe(outcomes);
}

}  // namespace unused

}  // namespace data_parallel_test
