// ckpt::profile_chain: sizes measured by the counting allocator, state left untouched.

#include <ckpt/profiler.h>

#include "support/support.h"

namespace profiler_test {

TEST(ProfilerTest, MeasuresSizesOfTheMemoryModel) {
  torch::manual_seed(0);
  std::vector<torch::nn::AnyModule> stages = {torch::nn::AnyModule(torch::nn::Linear(64, 128)),
                                              torch::nn::AnyModule(torch::nn::Tanh()),
                                              torch::nn::AnyModule(torch::nn::Linear(128, 32))};
  auto x = torch::randn({16, 64});
  auto chain = ckpt::profile_chain(stages, x, ckpt::ProfileOptions().repeats(3));
  ASSERT_EQ(chain.size(), 3);
  EXPECT_EQ(chain.input_bytes, 16 * 64 * 4);
  EXPECT_EQ(chain.stages[0].output_bytes, 16 * 128 * 4);
  EXPECT_EQ(chain.stages[1].output_bytes, 16 * 128 * 4);
  EXPECT_EQ(chain.stages[2].output_bytes, 16 * 32 * 4);
  // Linear keeps its output (its input is x_0); Tanh keeps its output (tanh' uses it). Run as
  // a checkpointed region they would keep the same, so no second storage option is offered.
  EXPECT_EQ(chain.stages[0].saved_bytes, 16 * 128 * 4);
  EXPECT_EQ(chain.stages[1].saved_bytes, 16 * 128 * 4);
  for (const auto& stage : chain.stages) EXPECT_TRUE(stage.alternatives.empty());
  for (const auto& stage : chain.stages) {
    EXPECT_GT(stage.forward_time, 0);      // the no-grad forward
    EXPECT_GT(stage.forward_all_time, 0);  // the grad-enabled forward, timed on its own
    EXPECT_GT(stage.backward_time, 0);
  }
  chain.validate();
}

TEST(ProfilerTest, LeavesRngBuffersAndGradientsAsTheyWere) {
  torch::nn::BatchNorm1d norm(8);
  torch::nn::Linear linear(8, 8);
  std::vector<torch::nn::AnyModule> stages = {torch::nn::AnyModule(linear),
                                              torch::nn::AnyModule(norm),
                                              torch::nn::AnyModule(torch::nn::Dropout(0.5))};
  auto input = torch::randn({4, 8});
  auto mean_before = norm->running_mean.clone();
  auto rng_before = at::detail::getDefaultCPUGenerator().get_state();
  ckpt::profile_chain(stages, input);
  EXPECT_TRUE(torch::equal(norm->running_mean, mean_before));
  EXPECT_TRUE(torch::equal(at::detail::getDefaultCPUGenerator().get_state(), rng_before));
  EXPECT_FALSE(linear->weight.grad().defined());
}

// A weight used by two stages gets one gradient buffer while profiling, so its own gradient is
// what comes back (restoring it twice used to leave the buffer of the other stage behind).
TEST(ProfilerTest, LeavesTheGradientOfATiedWeightAsItWas) {
  torch::manual_seed(0);
  torch::nn::Linear shared(8, 8);
  std::vector<torch::nn::AnyModule> stages = {torch::nn::AnyModule(shared),
                                              torch::nn::AnyModule(torch::nn::Tanh()),
                                              torch::nn::AnyModule(shared)};
  const auto input = torch::randn({4, 8});
  shared->weight.mutable_grad() = torch::randn({8, 8});
  const auto grad_before = shared->weight.grad().clone();
  ckpt::profile_chain(stages, input, ckpt::ProfileOptions().repeats(1));
  EXPECT_TRUE(torch::equal(shared->weight.grad(), grad_before));
  ckpt::measure_no_checkpoint_peak(stages, input);
  EXPECT_TRUE(torch::equal(shared->weight.grad(), grad_before));
}

// Each stage's backward creates its parameters' gradients; a shared one counts once, in the last
// stage that uses it (its backward runs first). Without counting, every stage has none.
TEST(ProfilerTest, CountsTheParameterGradientsEachBackwardCreates) {
  torch::nn::Linear shared(8, 8);
  torch::nn::Linear own(8, 4);
  std::vector<torch::nn::AnyModule> stages = {
      torch::nn::AnyModule(shared), torch::nn::AnyModule(torch::nn::Tanh()),
      torch::nn::AnyModule(shared), torch::nn::AnyModule(own)};
  const auto input = torch::randn({4, 8});
  const auto options = ckpt::ProfileOptions().repeats(1).calibrate_to_step(false);
  const auto counted = ckpt::profile_chain(stages, input, options);
  const std::vector<int64_t> expected = {0, 0, (8 * 8 + 8) * 4, (8 * 4 + 4) * 4};
  for (size_t i = 0; i < stages.size(); ++i) {
    EXPECT_EQ(counted.stages[i].gradient_bytes, expected[i]) << i;
  }
  const auto uncounted = ckpt::profile_chain(
      stages, input, ckpt::ProfileOptions(options).count_parameter_gradients(false));
  for (const auto& stage : uncounted.stages) EXPECT_EQ(stage.gradient_bytes, 0);
  for (const auto& p : shared->parameters()) EXPECT_FALSE(p.grad().defined());
}

// Calibrating to a measured step touches the times only: every size is what the uncalibrated
// profile measures. (That the times scale by one factor is plan::scale_times', tested in
// ChainTest; the factor itself is a wall-clock ratio, not testable here.)
TEST(ProfilerTest, CalibrationLeavesSizesAlone) {
  torch::manual_seed(0);
  std::vector<torch::nn::AnyModule> stages = {torch::nn::AnyModule(torch::nn::Linear(32, 64)),
                                              torch::nn::AnyModule(torch::nn::GELU()),
                                              torch::nn::AnyModule(torch::nn::Linear(64, 32))};
  const auto x = torch::randn({16, 32});
  const auto plain =
      ckpt::profile_chain(stages, x, ckpt::ProfileOptions().calibrate_to_step(false));
  const auto calibrated = ckpt::profile_chain(stages, x);
  ASSERT_EQ(plain.size(), calibrated.size());
  for (int i = 0; i < plain.size(); ++i) {
    EXPECT_EQ(calibrated.stages[i].output_bytes, plain.stages[i].output_bytes);
    EXPECT_EQ(calibrated.stages[i].saved_bytes, plain.stages[i].saved_bytes);
    EXPECT_EQ(calibrated.stages[i].backward_tmp_bytes, plain.stages[i].backward_tmp_bytes);
    EXPECT_GT(calibrated.stages[i].forward_time, 0);
    EXPECT_GT(calibrated.stages[i].backward_time, 0);
  }
  calibrated.validate();
}

// A stage that writes into its input can't be measured on an input of its own: a clear error,
// naming the stage and what to do, instead of autograd's about a leaf; and a first such stage
// leaves the caller's sample as it was (it was written into, then autograd's error followed).
TEST(ProfilerTest, AStageThatWritesIntoItsInputIsAClearErrorAndTheSampleStaysAsItWas) {
  for (const bool first : {false, true}) {
    SCOPED_TRACE(first ? "an in-place dropout first" : "an in-place ReLU second");
    std::vector<torch::nn::AnyModule> stages;
    if (first) {
      stages.emplace_back(torch::nn::Dropout(torch::nn::DropoutOptions(0.5).inplace(true)));
    }
    stages.emplace_back(torch::nn::Linear(16, 16));
    stages.emplace_back(torch::nn::ReLU(torch::nn::ReLUOptions(true)));
    const torch::Tensor sample = torch::ones({4, 16});
    try {
      ckpt::profile_chain(stages, sample);
      FAIL() << "profiled a stage that writes into its input";
    } catch (const c10::Error& error) {
      const std::string message = error.what_without_backtrace();
      const std::string stage = first ? "stage #0" : "stage #1";
      EXPECT_NE(message.find(stage + " writes into its input in place"), std::string::npos)
          << message;
      EXPECT_NE(message.find("Plan the chain with ckpt::PlannedSequential"), std::string::npos)
          << message;
    }
    EXPECT_TRUE(torch::equal(sample, torch::ones({4, 16})));
  }
}

}  // namespace profiler_test
