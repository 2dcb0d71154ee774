// MemoryTracker::peak_breakdown and MemoryLabel: what is live at a step's peak, by kind and by
// label, summing to the peak exactly.

#include <ckpt/checkpoint.h>
#include <ckpt/memory_label.h>
#include <ckpt/memory_tracker.h>

#include "support/support.h"

#include <numeric>
#include <sstream>
#include <thread>

namespace peak_breakdown_test {

int64_t sum_of_parts(const ckpt::MemoryBreakdown& breakdown) {
  int64_t sum = breakdown.parameters_bytes + breakdown.gradients_bytes +
                breakdown.optimizer_state_bytes + breakdown.other_bytes;
  for (const auto& entry : breakdown.labels) sum += entry.second;
  return sum;
}

// The bytes under `label`, 0 where it has none.
int64_t bytes_of(const ckpt::MemoryBreakdown& breakdown, const std::string& label) {
  for (const auto& [name, bytes] : breakdown.labels) {
    if (name == label) return bytes;
  }
  return 0;
}

int64_t storage_bytes(const std::vector<torch::Tensor>& tensors) {
  int64_t bytes = 0;
  for (const auto& tensor : tensors) {
    if (tensor.defined()) bytes += static_cast<int64_t>(tensor.storage().nbytes());
  }
  return bytes;
}

TEST(MemoryLabelTest, LabelsNestAndRegionsAreNumberedUnderTheirLabel) {
  EXPECT_EQ(ckpt::MemoryLabel::current(), "");
  ckpt::MemoryLabel outer("step");
  {
    ckpt::MemoryLabel inner("forward");
    EXPECT_EQ(ckpt::MemoryLabel::current(), "step/forward");
    std::vector<std::string> seen;
    const auto x = torch::ones({4}, torch::requires_grad());
    const auto record = [&](const torch::Tensor& t) {
      seen.push_back(ckpt::MemoryLabel::current());
      return t * 2;
    };
    const auto y = ckpt::checkpoint(record, ckpt::checkpoint(record, x));
    EXPECT_EQ(seen, (std::vector<std::string>{"step/forward/region 1", "step/forward/region 2"}));
    seen.clear();
    y.sum().backward();
    EXPECT_EQ(seen, (std::vector<std::string>{"step/forward/region 2/recompute",
                                              "step/forward/region 1/recompute"}));
  }
  EXPECT_EQ(ckpt::MemoryLabel::current(), "step");
}

// Tensors of known sizes under known labels: every part of the peak is known to the byte.
TEST(PeakBreakdownTest, PartsOfAHandMadePeakAreExact) {
  ckpt::MemoryTracker tracker;            // first: the parameter must be a counted block
  auto parameter = torch::empty({1000});  // 4000 bytes, from before recording
  tracker.record_breakdown();
  const int64_t base = tracker.current_bytes();
  torch::Tensor activation, state;
  {
    ckpt::MemoryLabel label("forward");
    activation = torch::empty({2000});  // 8000
  }
  {
    ckpt::MemoryLabel label("backward");
    parameter.mutable_grad() = torch::empty({1000});  // 4000
    auto scratch = torch::empty({500});               // 2000, freed before the peak
  }
  {
    ckpt::MemoryLabel label("optimizer");
    state = torch::empty({1000});  // 4000: the peak
  }
  const auto breakdown = tracker.peak_breakdown({parameter}, {state});
  EXPECT_EQ(breakdown.peak_bytes, tracker.peak_bytes());
  EXPECT_EQ(breakdown.peak_bytes, base + 16000);
  EXPECT_EQ(breakdown.where, "optimizer");
  EXPECT_EQ(breakdown.parameters_bytes, 4000);
  EXPECT_EQ(breakdown.gradients_bytes, 4000);
  EXPECT_EQ(breakdown.optimizer_state_bytes, 4000);
  ASSERT_EQ(breakdown.labels.size(), 1u);
  EXPECT_EQ(breakdown.labels[0], (std::pair<std::string, int64_t>{"forward", 8000}));
  EXPECT_EQ(breakdown.other_bytes, base - 4000);  // the parameter was counted in `base`
  EXPECT_EQ(sum_of_parts(breakdown), breakdown.peak_bytes);
  std::ostringstream text;
  text << breakdown;
  EXPECT_NE(text.str().find("at optimizer: parameters 4000 B, gradients 4000 B"), std::string::npos)
      << text.str();
}

// The U-Net's shape in small: the weights outweigh the activations, so the step peaks at its last
// gradient, in the backward of the first region, with every gradient live next to that region's
// recomputed activations. The second step is measured (the optimizer's state exists by then).
TEST(PeakBreakdownTest, AStepPeakIsSplitIntoParametersGradientsStateAndRegions) {
  torch::manual_seed(0);
  ckpt::MemoryTracker tracker;  // before the model, whose parameters must be counted blocks
  torch::nn::Linear first(torch::nn::LinearOptions(512, 512).bias(false));
  torch::nn::Linear second(torch::nn::LinearOptions(512, 512).bias(false));
  torch::nn::Linear head(torch::nn::LinearOptions(512, 512).bias(false));
  std::vector<torch::Tensor> parameters{first->weight, second->weight, head->weight};
  torch::optim::SGD optimizer(parameters, torch::optim::SGDOptions(0.01).momentum(0.9));
  const auto x = torch::randn({8, 512});
  tracker.record_breakdown();
  for (int step = 0; step < 2; ++step) {
    for (auto& parameter : parameters) parameter.mutable_grad().reset();
    tracker.reset_peak();
    torch::Tensor loss;
    {
      ckpt::MemoryLabel label("forward");
      const auto layer = [](torch::nn::Linear linear, const torch::Tensor& input) {
        return torch::tanh(linear->forward(input));
      };
      const auto h = ckpt::checkpoint(layer, first, x);
      loss = head(ckpt::checkpoint(layer, second, h)).square().sum();
    }
    {
      ckpt::MemoryLabel label("backward");
      loss.backward();
    }
    ckpt::MemoryLabel label("optimizer");
    optimizer.step();
  }
  const auto state = ckpt::optimizer_state_tensors(optimizer);
  ASSERT_EQ(state.size(), 3u);
  const auto breakdown = tracker.peak_breakdown(parameters, state);
  SCOPED_TRACE(::testing::PrintToString(breakdown.labels));
  EXPECT_EQ(breakdown.peak_bytes, tracker.peak_bytes());
  EXPECT_EQ(sum_of_parts(breakdown), breakdown.peak_bytes);
  EXPECT_EQ(breakdown.parameters_bytes, 3 * 512 * 512 * 4);
  EXPECT_EQ(breakdown.gradients_bytes,
            storage_bytes({first->weight.grad(), second->weight.grad(), head->weight.grad()}));
  EXPECT_EQ(breakdown.gradients_bytes, 3 * 512 * 512 * 4);
  EXPECT_EQ(breakdown.optimizer_state_bytes, storage_bytes(state));
  EXPECT_EQ(breakdown.where, "backward");
  EXPECT_GT(breakdown.other_bytes, 0);  // x, from before recording
}

// Activations outweigh the weights: the step peaks in the backward of the first region, whose
// recompute holds a 2 MiB hidden activation; the second region's was freed before.
TEST(PeakBreakdownTest, ActivationsAtThePeakAreAttributedToTheirRegion) {
  torch::manual_seed(0);
  torch::nn::Linear wide(64, 2048), narrow(2048, 64), small(64, 64);
  const auto x = torch::randn({256, 64});
  ckpt::MemoryTracker tracker;
  tracker.record_breakdown();
  torch::Tensor loss;
  {
    ckpt::MemoryLabel label("forward");
    const auto h = ckpt::checkpoint(
        [](torch::nn::Linear a, torch::nn::Linear b, const torch::Tensor& input) {
          return b->forward(torch::tanh(a->forward(input)));
        },
        wide, narrow, x);
    loss =
        ckpt::checkpoint([](torch::nn::Linear a,
                            const torch::Tensor& input) { return torch::tanh(a->forward(input)); },
                         small, h)
            .sum();
  }
  {
    ckpt::MemoryLabel label("backward");
    loss.backward();
  }
  std::vector<torch::Tensor> parameters = wide->parameters();
  for (const auto& module : {narrow->parameters(), small->parameters()}) {
    parameters.insert(parameters.end(), module.begin(), module.end());
  }
  const auto breakdown = tracker.peak_breakdown(parameters);
  SCOPED_TRACE(::testing::PrintToString(breakdown.labels));
  EXPECT_EQ(sum_of_parts(breakdown), breakdown.peak_bytes);
  EXPECT_EQ(
      breakdown.where.rfind("forward/region 1/recompute", 0) == 0 || breakdown.where == "backward",
      true)
      << breakdown.where;
  EXPECT_GE(bytes_of(breakdown, "forward/region 1/recompute"), 256 * 2048 * 4);
  EXPECT_EQ(bytes_of(breakdown, "forward/region 2/recompute"), 0);
  // The second region's gradients exist by then; the wide layer's does not.
  EXPECT_GE(breakdown.gradients_bytes, storage_bytes({small->weight.grad(), small->bias.grad()}));
  EXPECT_LT(breakdown.gradients_bytes, storage_bytes(parameters));
}

TEST(PeakBreakdownTest, TensorsFromElsewhereAndAfterThePeakAreNotCounted) {
  std::vector<float> outside(100, 1.0f);
  const auto borrowed = torch::from_blob(outside.data(), {100});  // not the counting allocator's
  ckpt::MemoryTracker tracker;
  tracker.record_breakdown();
  { auto peak = torch::empty({1000}); }
  const auto later = torch::empty({10});  // allocated after the peak
  const auto breakdown = tracker.peak_breakdown({borrowed, later});
  EXPECT_EQ(breakdown.parameters_bytes, 0);
  EXPECT_EQ(sum_of_parts(breakdown), breakdown.peak_bytes);
}

TEST(PeakBreakdownTest, TiedParametersAreCountedOnce) {
  ckpt::MemoryTracker tracker;
  const auto weight = torch::ones({256});
  tracker.record_breakdown();
  const auto breakdown = tracker.peak_breakdown({weight, weight.view({16, 16})});
  EXPECT_EQ(breakdown.parameters_bytes, 1024);
  EXPECT_EQ(sum_of_parts(breakdown), breakdown.peak_bytes);
}

TEST(PeakBreakdownTest, ConcurrentAllocationsKeepThePartsSummingToThePeak) {
  ckpt::MemoryTracker tracker;
  tracker.record_breakdown();
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([i] {
      ckpt::MemoryLabel label("thread " + std::to_string(i));
      for (int j = 0; j < 500; ++j) auto t = torch::empty({64 + j % 7});
    });
  }
  for (auto& thread : threads) thread.join();
  const auto breakdown = tracker.peak_breakdown({});
  EXPECT_EQ(breakdown.peak_bytes, tracker.peak_bytes());
  EXPECT_EQ(sum_of_parts(breakdown), breakdown.peak_bytes);
}

TEST(PeakBreakdownTest, RefusesWithoutRecordingOrForAThreadScope) {
  ckpt::MemoryTracker tracker;
  CKPT_EXPECT_THROWS_WITH(tracker.peak_breakdown({}), "call record_breakdown() before the step");
  ckpt::MemoryTracker thread(c10::Device(c10::DeviceType::CPU), ckpt::MemoryScope::CallingThread);
  CKPT_EXPECT_THROWS_WITH(thread.record_breakdown(), "Use a MemoryScope::Process tracker");
}

TEST(PeakBreakdownTest, KnowsTheStateOfLibTorchOptimizers) {
  const auto weight = torch::ones({4}, torch::requires_grad());
  weight.mutable_grad() = torch::ones({4});
  torch::optim::Adam adam({weight}, torch::optim::AdamOptions(0.1).amsgrad(true));
  adam.step();
  EXPECT_EQ(ckpt::optimizer_state_tensors(adam).size(), 3u);
  torch::optim::RMSprop rmsprop({weight}, torch::optim::RMSpropOptions(0.1).centered(true));
  rmsprop.step();
  EXPECT_EQ(storage_bytes(ckpt::optimizer_state_tensors(rmsprop)), 2 * 16);  // no momentum
}

}  // namespace peak_breakdown_test
