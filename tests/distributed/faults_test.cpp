// ckpt::ProcessGroup and ckpt::DataParallel when something goes wrong: a rank killed in the
// middle of a step, a port in use, world sizes that disagree, a rank out of range, a rank that
// never comes, a parameter whose gradient arrives twice. Every wait is bounded (ranks.h).

#include "ranks.h"

#include <ckpt/checkpoint.h>
#include <ckpt/distributed.h>

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <thread>

namespace faults_test {

using ckpt::test::describe;
using ckpt::test::free_port;
using ckpt::test::run_ranks;

constexpr auto kDeadline = std::chrono::seconds(90);

ckpt::RendezvousOptions options(int rank, int world, int port, int timeout_seconds = 10) {
  return ckpt::RendezvousOptions().rank(rank).world_size(world).master_port(port).timeout(
      std::chrono::seconds(timeout_seconds));
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

torch::nn::Sequential make_chain() {
  torch::manual_seed(3);
  return torch::nn::Sequential(torch::nn::Linear(32, 64), torch::nn::Tanh(),
                               torch::nn::Linear(64, 64), torch::nn::Tanh(),
                               torch::nn::Linear(64, 8));
}

// Rank 1 dies by SIGKILL inside the backward pass of step 2, after rank 0's all-reduces of that
// step have started waiting for it. Rank 0 must stop with an error well within its timeout of
// 20 s (the dead peer's connection closes at once), not hang.
TEST(DataParallelFaults, RankKilledMidStepStopsTheOthersWithAnError) {
  const int port = free_port();
  const auto outcomes = run_ranks(
      2,
      [port](int rank) {
        const auto group = ckpt::ProcessGroup::join(options(rank, 2, port, 20));
        auto chain = make_chain();
        ckpt::DataParallel parallel(chain.ptr(), group);
        for (int step = 0; step < 3; ++step) {
          parallel.begin_step();
          torch::Tensor h =
              ckpt::checkpoint([&chain](const torch::Tensor& x) { return chain->forward(x); },
                               torch::randn({4, 32}));
          if (rank == 1 && step == 2) {
            h.register_hook([](const torch::Tensor& grad) {
              std::raise(SIGKILL);
              return grad;
            });
          }
          h.sum().backward();
        }
      },
      kDeadline);
  ASSERT_EQ(outcomes[1].signal, SIGKILL) << describe(outcomes);
  EXPECT_FALSE(outcomes[0].timed_out) << describe(outcomes);
  EXPECT_EQ(outcomes[0].exit_code, 1) << describe(outcomes);
  EXPECT_TRUE(contains(outcomes[0].message,
                       "ckpt::DataParallel: on rank 0, the all-reduce of gradient bucket"))
      << describe(outcomes);
  EXPECT_LT(outcomes[0].seconds, 60) << describe(outcomes);
}

// Rank 1 dies between collectives: rank 0's next collective is an error, not a hang or a signal.
TEST(ProcessGroupErrors, CollectivesAfterAPeerDiedFailWithAnError) {
  const int port = free_port();
  const auto outcomes = run_ranks(
      2,
      [port](int rank) {
        const auto group = ckpt::ProcessGroup::join(options(rank, 2, port, 20));
        group.barrier();
        if (rank == 1) std::raise(SIGKILL);
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        auto tensor = torch::ones({1 << 16});
        for (int i = 0; i < 50; ++i) group.all_reduce_sum(tensor);
      },
      kDeadline);
  ASSERT_EQ(outcomes[1].signal, SIGKILL) << describe(outcomes);
  EXPECT_EQ(outcomes[0].signal, 0) << describe(outcomes);
  EXPECT_EQ(outcomes[0].exit_code, 1) << describe(outcomes);
  EXPECT_LT(outcomes[0].seconds, 60) << describe(outcomes);
}

// A peer that dies mid-collective closes sockets that Gloo may be writing to, without
// MSG_NOSIGNAL: at SIGPIPE's default action that kills the writer (seen once in 30 runs of
// RankKilledMidStepStopsTheOthersWithAnError). join() ignores SIGPIPE, as Python does at
// start-up, unless the program handles it itself.
void programs_own_sigpipe_handler(int) {}

TEST(ProcessGroupErrors, JoinIgnoresSigpipeUnlessTheProgramHandlesIt) {
  const auto outcomes = run_ranks(
      1,
      [](int) {
        const auto disposition = [] {
          struct sigaction current {};
          sigaction(SIGPIPE, nullptr, &current);
          return current.sa_handler;
        };
        std::signal(SIGPIPE, SIG_DFL);
        ckpt::ProcessGroup::join(options(0, 1, 0));
        TORCH_CHECK(disposition() == SIG_IGN, "SIGPIPE kept its default action");
        std::signal(SIGPIPE, programs_own_sigpipe_handler);
        ckpt::ProcessGroup::join(options(0, 1, 0));
        TORCH_CHECK(disposition() == programs_own_sigpipe_handler,
                    "the program's SIGPIPE handler was replaced");
      },
      kDeadline);
  EXPECT_EQ(outcomes[0].exit_code, 0) << describe(outcomes);
}

TEST(ProcessGroupErrors, PortInUseSaysSo) {
  const auto outcomes = run_ranks(
      1,
      [](int) {
        const int holder = socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in address{};
        address.sin_family = AF_INET;
        address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t length = sizeof address;
        TORCH_CHECK(bind(holder, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
                        listen(holder, 1) == 0 &&
                        getsockname(holder, reinterpret_cast<sockaddr*>(&address), &length) == 0,
                    "the test could not hold a port");
        ckpt::ProcessGroup::join(options(0, 1, ntohs(address.sin_port)));
      },
      kDeadline);
  EXPECT_EQ(outcomes[0].exit_code, 1) << describe(outcomes);
  EXPECT_TRUE(contains(outcomes[0].message, "the port is in use")) << describe(outcomes);
}

TEST(ProcessGroupErrors, WorldSizesThatDisagreeSaySo) {
  const int port = free_port();
  const auto outcomes = run_ranks(
      2, [port](int rank) { ckpt::ProcessGroup::join(options(rank, rank == 0 ? 2 : 3, port)); },
      kDeadline);
  // Rank 0 always sees the mismatch. Rank 1 sees it too, unless rank 0 has already stopped
  // (and closed its store) when rank 1 reads rank 0's world size: then it says so.
  EXPECT_EQ(outcomes[0].exit_code, 1) << describe(outcomes);
  EXPECT_TRUE(contains(outcomes[0].message,
                       "rank 1 was given a world size of 3, but rank 0 was "
                       "given 2. Start every process of the group with the "
                       "same world size"))
      << describe(outcomes);
  EXPECT_EQ(outcomes[1].exit_code, 1) << describe(outcomes);
  EXPECT_TRUE(contains(outcomes[1].message, "same world size") ||
              contains(outcomes[1].message, "Rank 0 has probably stopped with an error"))
      << describe(outcomes);
}

TEST(ProcessGroupErrors, RankOutOfRangeSaysSo) {
  const auto outcomes = run_ranks(
      1, [](int) { ckpt::ProcessGroup::join(options(2, 2, free_port())); }, kDeadline);
  EXPECT_EQ(outcomes[0].exit_code, 1) << describe(outcomes);
  EXPECT_TRUE(contains(outcomes[0].message, "rank 2 is out of range for a world of size 2"))
      << describe(outcomes);
  EXPECT_LT(outcomes[0].seconds, 5) << describe(outcomes);
}

TEST(ProcessGroupErrors, RankThatNeverComesTimesOutNamingIt) {
  const int port = free_port();
  const auto outcomes = run_ranks(
      1, [port](int) { ckpt::ProcessGroup::join(options(0, 3, port, 2)); }, kDeadline);
  EXPECT_EQ(outcomes[0].exit_code, 1) << describe(outcomes);
  EXPECT_TRUE(contains(outcomes[0].message, "these ranks did not join: 1 2")) << describe(outcomes);
  EXPECT_LT(outcomes[0].seconds, 30) << describe(outcomes);
}

// A rank 0 stopped by SIGSTOP still accepts connections (the kernel completes them) but never
// answers: c10d's client then waited for ever (issue 27, item 4). A listening socket that never
// accepts is the same thing, without a second process.
TEST(ProcessGroupErrors, RankZeroThatAcceptsButNeverAnswersTimesOut) {
  const auto outcomes = run_ranks(
      1,
      [](int) {
        const int silent = socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in address{};
        address.sin_family = AF_INET;
        address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t length = sizeof address;
        TORCH_CHECK(bind(silent, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
                        listen(silent, 16) == 0 &&
                        getsockname(silent, reinterpret_cast<sockaddr*>(&address), &length) == 0,
                    "the test could not listen on a port");
        ckpt::ProcessGroup::join(options(1, 2, ntohs(address.sin_port), 2));
      },
      kDeadline);
  EXPECT_EQ(outcomes[0].exit_code, 1) << describe(outcomes);
  EXPECT_TRUE(contains(outcomes[0].message, "but it did not answer within 2 s"))
      << describe(outcomes);
  EXPECT_LT(outcomes[0].seconds, 10) << describe(outcomes);
}

// An address that does not resolve fails before any connection attempt, not after c10d's
// retries (153 s against a timeout of 60 s in issue 27, item 14).
TEST(ProcessGroupErrors, MasterAddressThatDoesNotResolveFailsAtOnce) {
  for (const char* address : {"256.1.1.1", "no-such-host.invalid"}) {
    const auto outcomes = run_ranks(
        1,
        [address](int) { ckpt::ProcessGroup::join(options(1, 2, 29500, 60).master_addr(address)); },
        kDeadline);
    EXPECT_EQ(outcomes[0].exit_code, 1) << describe(outcomes);
    EXPECT_TRUE(contains(outcomes[0].message,
                         std::string("the master address '") + address + "' does not resolve"))
        << describe(outcomes);
    EXPECT_LT(outcomes[0].seconds, 20) << describe(outcomes);
  }
}

TEST(ProcessGroupErrors, EnvironmentAsTorchrunSetsIt) {
  const auto outcomes = run_ranks(
      1,
      [](int) {
        setenv("MASTER_ADDR", "127.0.0.1", 1);
        setenv("MASTER_PORT", "29611", 1);
        setenv("RANK", "1", 1);
        setenv("WORLD_SIZE", "4", 1);
        const auto read = ckpt::RendezvousOptions::from_environment();
        TORCH_CHECK(read.master_addr() == "127.0.0.1" && read.master_port() == 29611 &&
                        read.rank() == 1 && read.world_size() == 4,
                    "the environment was misread");
        unsetenv("WORLD_SIZE");
        ckpt::RendezvousOptions::from_environment();
      },
      kDeadline);
  EXPECT_EQ(outcomes[0].exit_code, 1) << describe(outcomes);
  EXPECT_TRUE(contains(outcomes[0].message, "WORLD_SIZE is not set")) << describe(outcomes);
}

// Under use_reentrant(true), a Linear used in two regions accumulates its gradient in each
// region's own backward: the second arrival must raise ckpt's error, not reduce half a gradient.
TEST(DataParallelErrors, ReentrantRegionsSharingAParameterSayWhy) {
  const int port = free_port();
  const auto outcomes = run_ranks(
      2,
      [port](int rank) {
        const auto group = ckpt::ProcessGroup::join(options(rank, 2, port));
        torch::manual_seed(1);
        torch::nn::Linear first(8, 8);
        torch::nn::Linear shared(8, 8);
        torch::nn::Sequential model(first, shared, shared);
        ckpt::DataParallel parallel(model.ptr(), group);
        const auto reentrant = ckpt::CheckpointOptions().use_reentrant(true);
        parallel.begin_step();
        torch::Tensor h = first(torch::randn({2, 8}));
        h = ckpt::checkpoint(
            reentrant, [&](const torch::Tensor& x) { return shared(x); }, h);
        h = ckpt::checkpoint(
            reentrant, [&](const torch::Tensor& x) { return shared(x); }, h);
        h.sum().backward();
      },
      kDeadline);
  for (const auto& outcome : outcomes) {
    EXPECT_EQ(outcome.exit_code, 1) << describe(outcomes);
    EXPECT_TRUE(contains(outcome.message, "received its gradient a second time"))
        << describe(outcomes);
  }
}

// Ranks that build different models (a --width that differs, issue 27 item 16) stop with the same
// error on every rank, naming the parameter: not rank 1 naming the shapes while rank 0 gets Gloo's
// message about a closed connection.
TEST(DataParallelErrors, ModelsThatDifferSaySoOnEveryRank) {
  const int port = free_port();
  const auto outcomes = run_ranks(
      2,
      [port](int rank) {
        const auto group = ckpt::ProcessGroup::join(options(rank, 2, port));
        torch::nn::Sequential model(torch::nn::Linear(8, 16), torch::nn::Tanh(),
                                    torch::nn::Linear(16, rank == 0 ? 4 : 6));
        ckpt::DataParallel parallel(model.ptr(), group);
      },
      kDeadline);
  for (const auto& outcome : outcomes) {
    EXPECT_EQ(outcome.exit_code, 1) << describe(outcomes);
    EXPECT_TRUE(contains(outcome.message,
                         "the ranks' models differ: parameter #2: rank 0 has '2.weight' Float "
                         "[4, 16] strides [16, 1], but rank 1 has '2.weight' Float [6, 16]"))
        << describe(outcomes);
  }
}

TEST(DataParallelErrors, ModelsWithDifferentParameterCountsSaySo) {
  const int port = free_port();
  const auto outcomes = run_ranks(
      2,
      [port](int rank) {
        const auto group = ckpt::ProcessGroup::join(options(rank, 2, port));
        torch::nn::Sequential model(torch::nn::Linear(8, 8));
        if (rank == 1) model->push_back(torch::nn::Linear(8, 8));
        ckpt::DataParallel parallel(model.ptr(), group);
      },
      kDeadline);
  for (const auto& outcome : outcomes) {
    EXPECT_EQ(outcome.exit_code, 1) << describe(outcomes);
    EXPECT_TRUE(contains(outcome.message, "rank 0 has no parameter #2 (it has 2)"))
        << describe(outcomes);
  }
}

// A parameter that gets no gradient in a step leaves its bucket unreduced: the next begin_step
// names it and points at ckpt's option (it pointed at Python's find_unused_parameters).
TEST(DataParallelErrors, ParameterWithoutGradientIsNamedWithCkptsOption) {
  const int port = free_port();
  const auto outcomes = run_ranks(
      2,
      [port](int rank) {
        const auto group = ckpt::ProcessGroup::join(options(rank, 2, port));
        torch::nn::Sequential model(torch::nn::Linear(8, 8), torch::nn::Linear(8, 8));
        ckpt::DataParallel parallel(model.ptr(), group);
        for (int step = 0; step < 2; ++step) {
          parallel.begin_step();
          model[0]->as<torch::nn::Linear>()->forward(torch::randn({2, 8})).sum().backward();
        }
      },
      kDeadline);
  for (const auto& outcome : outcomes) {
    EXPECT_EQ(outcome.exit_code, 1) << describe(outcomes);
    EXPECT_TRUE(contains(outcome.message,
                         "in the previous step, these parameters got no gradient: '1.weight' "
                         "(#2, shape [8, 8]), '1.bias' (#3, shape [8])"))
        << describe(outcomes);
    EXPECT_TRUE(contains(outcome.message, "DataParallelOptions().find_unused_parameters(true)"))
        << describe(outcomes);
  }
}

TEST(DataParallelErrors, FindUnusedParametersNeedsPrepareForBackward) {
  const auto outcomes = run_ranks(
      1,
      [](int) {
        const auto group = ckpt::ProcessGroup::join(options(0, 1, 0));
        torch::nn::Linear model(4, 4);
        ckpt::DataParallel parallel(model.ptr(), group,
                                    ckpt::DataParallelOptions().find_unused_parameters(true));
        parallel.begin_step();
        model(torch::randn({2, 4})).sum().backward();
      },
      kDeadline);
  EXPECT_EQ(outcomes[0].exit_code, 1) << describe(outcomes);
  EXPECT_TRUE(contains(outcomes[0].message, "got its gradient before prepare_for_backward"))
      << describe(outcomes);
}

// A reentrant region's parameters are not in the graph of its outputs, so the search counts them
// as unused; their gradient then arrives anyway.
TEST(DataParallelErrors, FindUnusedParametersWithReentrantRegionsSaysWhy) {
  const auto outcomes = run_ranks(
      1,
      [](int) {
        const auto group = ckpt::ProcessGroup::join(options(0, 1, 0));
        torch::nn::Linear first(4, 4);
        torch::nn::Linear inner(4, 4);
        torch::nn::Sequential model(first, inner);
        ckpt::DataParallel parallel(model.ptr(), group,
                                    ckpt::DataParallelOptions().find_unused_parameters(true));
        parallel.begin_step();
        const torch::Tensor loss =
            ckpt::checkpoint(
                ckpt::CheckpointOptions().use_reentrant(true),
                [&](const torch::Tensor& x) { return inner(x); }, first(torch::randn({2, 4})))
                .sum();
        parallel.prepare_for_backward({loss});
        loss.backward();
      },
      kDeadline);
  EXPECT_EQ(outcomes[0].exit_code, 1) << describe(outcomes);
  EXPECT_TRUE(contains(outcomes[0].message, "counted it as unused")) << describe(outcomes);
}

// scripts/gpu-check.sh runs this one: a world of one rank on NCCL.
TEST(DataParallelNccl, OneRankTrainsOnTheGpu_CUDA) {
  if (!ckpt::backend_available(ckpt::Backend::Nccl)) GTEST_SKIP() << "built without NCCL";
  const auto outcomes = run_ranks(
      1,
      [](int) {
        if (!torch::cuda::is_available()) std::_Exit(77);
        const auto group = ckpt::ProcessGroup::join(
            ckpt::RendezvousOptions().master_port(0).world_size(1), ckpt::Backend::Nccl);
        auto chain = make_chain();
        chain->to(torch::kCUDA);
        ckpt::DataParallel parallel(chain.ptr(), group);
        parallel.begin_step();
        ckpt::checkpoint([&chain](const torch::Tensor& x) { return chain->forward(x); },
                         torch::randn({4, 32}, torch::kCUDA))
            .sum()
            .backward();
        for (const int64_t count : parallel.reductions()) TORCH_CHECK(count == 1, "not reduced");
      },
      kDeadline);
  if (outcomes[0].exit_code == 77) GTEST_SKIP() << "no CUDA device";
  EXPECT_TRUE(outcomes[0].ok()) << describe(outcomes);
}

}  // namespace faults_test
