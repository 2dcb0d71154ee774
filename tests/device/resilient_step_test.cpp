// ckpt::resilient_step (issue 51, item 1): a step of one's own that runs out of device memory runs
// again from where it started, and ends as a step that took the smaller way from the start would
// have: loss, gradients (accumulated onto earlier ones), BatchNorm statistics and the RNG, to the
// bit. And what it refuses: a step that changed the parameters, and one that never fits.

#include <ckpt/emulated_device.h>
#include <ckpt/resilient_step.h>
#include <ckpt/sequential.h>

#include "device/device_suite.h"

#include <string>
#include <vector>

namespace resilient_step_test {

using ckpt::test::take_grads;

class ResilientStepTest : public ckpt::test::DeviceTest {
 protected:
  void SetUp() override {
    DeviceTest::SetUp();
    if (IsSkipped()) return;
    if (type() != c10::DeviceType::PrivateUse1) {
      GTEST_SKIP() << "a capacity can be set on the emulated device only";
    }
  }
  void TearDown() override { ckpt::emulated_device::set_memory_limit(0); }

  torch::nn::Sequential make_model() const {
    torch::manual_seed(0);
    torch::nn::Sequential model;
    for (int i = 0; i < 6; ++i) {
      model->push_back(torch::nn::Linear(128, 128));
      model->push_back(torch::nn::BatchNorm1d(128));
      model->push_back(torch::nn::Tanh());
      model->push_back(torch::nn::Dropout(0.2));
    }
    model->to(device());
    for (auto& p : model->parameters()) p.mutable_grad() = torch::full_like(p, 0.5);
    return model;
  }

  // The step: plainly first; after running out, checkpointed in four segments.
  static at::Tensor step(torch::nn::Sequential& model, const at::Tensor& x, bool checkpointed) {
    const at::Tensor y =
        checkpointed ? ckpt::checkpoint_sequential(model, 4, x) : model->forward(x);
    at::Tensor loss = y.pow(2).mean();
    loss.backward();
    return loss;
  }

  int64_t held_by(bool checkpointed, const at::Tensor& x) const {
    auto model = make_model();
    ckpt::emulated_device::reset_peak_memory(device().index());
    const int64_t before = ckpt::emulated_device::memory_stats(device().index()).allocated_bytes;
    step(model, x, checkpointed);
    return ckpt::emulated_device::memory_stats(device().index()).peak_allocated_bytes - before;
  }

  struct Ended {
    at::Tensor loss;
    std::vector<at::Tensor> grads, buffers;
    at::Tensor next_cpu, next_device;  // a draw after the step: the RNG's end state
  };
  Ended ended(torch::nn::Sequential& model, const at::Tensor& loss) const {
    Ended e{loss.cpu(), {}, {}, torch::rand({4}), torch::rand({4}, on()).cpu()};
    for (const auto& g : take_grads(*model)) e.grads.push_back(g.cpu());
    for (const auto& b : model->buffers()) e.buffers.push_back(b.cpu());
    return e;
  }
};

TEST_P(ResilientStepTest, AStepThatRunsOutRunsAgainAndEndsAsTheSmallerWayWould) {
  CKPT_SKIP_IF(missing_rng());
  CKPT_SKIP_IF(missing_memory_statistics());
  const at::Tensor x = torch::randn({512, 128}, on());
  const int64_t plain = held_by(false, x), checkpointed = held_by(true, x);
  ASSERT_LT(checkpointed, plain * 3 / 4);

  auto reference_model = make_model();
  seed(7);
  const at::Tensor reference_loss = step(reference_model, x, /*checkpointed=*/true);
  const Ended reference = ended(reference_model, reference_loss);

  auto model = make_model();
  seed(7);
  std::vector<ckpt::StepAttempt> attempts;
  ckpt::test::WarningCapture warnings;
  ckpt::emulated_device::set_memory_limit(
      ckpt::emulated_device::memory_stats(device().index()).allocated_bytes +
      (plain + checkpointed) / 2);
  const at::Tensor loss = ckpt::resilient_step(*model, [&](const ckpt::StepAttempt& attempt) {
    attempts.push_back(attempt);
    return step(model, x, attempt.index > 0);
  });
  ckpt::emulated_device::set_memory_limit(0);

  ASSERT_EQ(attempts.size(), 2u);
  EXPECT_FALSE(attempts[0].budget_bytes.has_value());
  ASSERT_TRUE(attempts[1].failed_peak_bytes.has_value());
  EXPECT_LE(*attempts[1].failed_peak_bytes, (plain + checkpointed) / 2);
  EXPECT_LT(*attempts[1].budget_bytes, *attempts[1].failed_peak_bytes);
  ASSERT_EQ(warnings.messages.size(), 1u);
  EXPECT_NE(warnings.messages[0].find("runs again (attempt 2 of 4"), std::string::npos);

  const Ended survived = ended(model, loss);
  EXPECT_TRUE(ckpt::test::bit_equal(survived.loss, reference.loss));
  for (size_t i = 0; i < reference.grads.size(); ++i) {
    EXPECT_TRUE(ckpt::test::bit_equal(survived.grads[i], reference.grads[i])) << "gradient " << i;
  }
  for (size_t i = 0; i < reference.buffers.size(); ++i) {
    EXPECT_TRUE(ckpt::test::bit_equal(survived.buffers[i], reference.buffers[i])) << "buffer " << i;
  }
  EXPECT_TRUE(ckpt::test::bit_equal(survived.next_cpu, reference.next_cpu));
  EXPECT_TRUE(ckpt::test::bit_equal(survived.next_device, reference.next_device));
}

TEST_P(ResilientStepTest, AStepThatChangedTheParametersOrNeverFitsPassesTheErrorOn) {
  auto model = make_model();
  const auto out_of_memory = [] {
    TORCH_CHECK_WITH(OutOfMemoryError, false, "out of memory (raised by the test)");
  };
  int runs = 0;
  CKPT_EXPECT_THROWS_WITH(ckpt::resilient_step(*model,
                                               [&](const ckpt::StepAttempt&) {
                                                 ++runs;
                                                 const at::NoGradGuard no_grad;
                                                 model->parameters()[0].add_(1.0);
                                                 out_of_memory();
                                                 return 0;
                                               }),
                          "changed parameters in place");
  EXPECT_EQ(runs, 1);

  runs = 0;
  CKPT_EXPECT_THROWS_WITH(ckpt::resilient_step(
                              *model,
                              [&](const ckpt::StepAttempt&) {
                                ++runs;
                                out_of_memory();
                                return 0;
                              },
                              ckpt::ResilientStepOptions().max_attempts(3).warn(false)),
                          "ran out of device memory in each of its 3 runs");
  EXPECT_EQ(runs, 3);
  CKPT_EXPECT_THROWS_WITH(ckpt::resilient_step(
                              *model, [](const ckpt::StepAttempt&) { return 0; },
                              ckpt::ResilientStepOptions().max_attempts(0)),
                          "max_attempts must be at least 1");
}

CKPT_INSTANTIATE_DEVICE_SUITE(ResilientStepTest);

}  // namespace resilient_step_test
