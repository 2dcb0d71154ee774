// Planning without the device (issue 51, item 3): every bench model profiled on the meta device
// under a ModeledDevice predicts the peaks of a real profile, and the plan it chooses fits when
// the real model runs it.

#include <ckpt/memory_tracker.h>
#include <ckpt/model_profiler.h>
#include <ckpt/modeled_device.h>
#include <ckpt/plan/model.h>
#include <ckpt/plan/schedule.h>
#include <ckpt/plan/simulator.h>
#include <ckpt/plan/solvers.h>
#include <ckpt/planned_sequential.h>
#include <ckpt/profiler.h>

#include <ATen/CPUGeneratorImpl.h>

#include "bench_models.h"
#include "marked_models.h"
#include "support/dropout_block.h"
#include "support/modeled_peaks.h"
#include "support/support.h"

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace modeled_device_test {

using ckpt::models::build_model;
using ckpt::models::model_config;
using ckpt::models::model_names;

// The CPU as the counting allocator counts it; the throughputs only decide times.
ckpt::DeviceProfile cpu_profile() {
  ckpt::DeviceProfile profile;
  profile.name = "cpu (modeled)";
  profile.allocation_granularity = 1;
  profile.count_cpu_scratch = true;
  profile.random_state_bytes =  // as DeviceProfile::measure sets it on the CPU
      static_cast<int64_t>(at::detail::getDefaultCPUGenerator().get_state().nbytes());
  return profile;
}

std::vector<torch::nn::AnyModule> stages_of(const torch::nn::Sequential& model) {
  return {model->begin(), model->end()};
}

TEST(ModeledDeviceTest, AMetaProfileOfEveryBenchModelPredictsTheRealProfilesPeaks) {
  for (const std::string& name : model_names()) {
    SCOPED_TRACE(name);
    const auto config = model_config(name, /*quick=*/true);
    auto model = build_model(config);
    const auto x = ckpt::models::make_input(config);
    const auto real = ckpt::profile_chain(stages_of(model), x);

    auto meta = build_model(config);
    ckpt::move_to_meta(*meta);
    ckpt::plan::Chain modeled;
    {
      const ckpt::ModeledDevice device(cpu_profile());
      modeled = ckpt::profile_chain(stages_of(meta),
                                    torch::empty(x.sizes(), x.options().device(torch::kMeta)));
      EXPECT_GT(device.seconds(), 0.0);
    }
    ckpt::test::expect_peaks_within_two_percent(modeled, real);
  }
}

// A step's peak above what lived before it, with the model's output consumed by a loss that
// does not keep it (as in training).
int64_t measured_step_peak(ckpt::PlannedSequential& planned, const torch::Tensor& x) {
  for (auto& p : planned->parameters()) p.mutable_grad().reset();
  ckpt::MemoryTracker tracker;
  tracker.reset_peak();
  const int64_t before = tracker.current_bytes() - static_cast<int64_t>(x.nbytes());
  planned(x).sum().backward();
  return tracker.peak_bytes() - before;
}

// The random state a planned chain keeps on the CPU (docs/memory-model.md, "Random state"): a
// meta profile under a modeled CPU counts it as a real profile does, for the stages that draw
// random numbers (the meta device's operators move no generator: their draws are counted).
TEST(ModeledDeviceTest, AMetaProfileCountsTheRandomStateOfStagesThatDraw) {
  const auto make = [] {
    torch::nn::Sequential model;
    for (int i = 0; i < 4; ++i) {
      model->push_back(ckpt::test::DropoutBlock());
      model->push_back(torch::nn::Linear(64, 64));
    }
    return model;
  };
  auto model = make();
  const auto x = torch::randn({32, 64});
  const auto real = ckpt::profile_chain(stages_of(model), x);
  auto meta = make();
  ckpt::move_to_meta(*meta);
  ckpt::plan::Chain modeled;
  {
    const ckpt::ModeledDevice device(cpu_profile());
    modeled = ckpt::profile_chain(stages_of(meta), torch::empty({32, 64}, torch::kMeta));
  }
  ASSERT_GT(real.random_state_bytes, 0);
  EXPECT_EQ(modeled.random_state_bytes, real.random_state_bytes);
  for (int i = 0; i < real.size(); ++i) {
    const auto index = static_cast<size_t>(i);
    EXPECT_EQ(real.stages[index].random_state_bytes, i % 2 == 0 ? real.random_state_bytes : 0);
    EXPECT_EQ(modeled.stages[index].random_state_bytes, real.stages[index].random_state_bytes)
        << "stage " << i;
  }
  ckpt::test::expect_peaks_within_two_percent(modeled, real);
  // An accelerator keeps its states in host memory: none in the counted memory.
  ckpt::DeviceProfile accelerator = cpu_profile();
  accelerator.random_state_bytes = 0;
  const ckpt::ModeledDevice device(accelerator);
  EXPECT_EQ(
      ckpt::profile_chain(stages_of(meta), torch::empty({32, 64}, torch::kMeta)).random_state_bytes,
      0);
}

TEST(ModeledDeviceTest, APlanMadeWithoutTheDeviceFitsWhenTheModelRunsIt) {
  for (const std::string name : {"resnet", "transformer"}) {
    SCOPED_TRACE(name);
    // The bench's sizes: at the quick ones (kilobytes a step), the planner's own model of a
    // selective stage errs by 6%, whichever profile it plans from.
    const auto config = model_config(name, /*quick=*/false);
    auto model = build_model(config);
    const auto x = ckpt::models::make_input(config);
    auto profiler = std::make_shared<ckpt::ModeledProfiler>(cpu_profile());
    ckpt::PlannedSequential probe(model, ckpt::Budget::minimum(),
                                  ckpt::PlannedSequentialOptions().profiler(profiler));
    // Clones that keep a graph into the parameters alive while they plan, as a user's code may.
    std::vector<torch::Tensor> before;
    for (const auto& t : model->parameters()) before.push_back(t.clone());
    for (const auto& t : model->buffers()) before.push_back(t.clone());
    probe->plan(x);
    size_t i = 0;  // planning neither read nor changed the model's values
    for (const auto& t : model->parameters()) EXPECT_TRUE(ckpt::test::bit_equal(t, before[i++]));
    for (const auto& t : model->buffers()) EXPECT_TRUE(ckpt::test::bit_equal(t, before[i++]));
    const int64_t smallest = probe->budget_bytes();
    for (const int64_t budget : {smallest * 5 / 4, smallest * 3 / 2}) {
      ckpt::PlannedSequential planned(model, ckpt::Budget::bytes(budget),
                                      ckpt::PlannedSequentialOptions().profiler(profiler));
      planned->plan(x);
      const int64_t measured = measured_step_peak(planned, x);
      const int64_t predicted = planned->prediction().peak_bytes;
      // The planner's model of a selective stage's backward is 2% short on the transformer, from
      // a real profile as from this one (whose peaks are the same): the bound
      // PlannedSequentialTest.MeasuredPeakFollowsThePrediction allows plans of a real profile.
      EXPECT_LE(measured, budget * 103 / 100)
          << "measured " << measured << ", predicted " << predicted << ", schedule "
          << ckpt::plan::to_string(planned->schedule());
      EXPECT_NEAR(static_cast<double>(measured), static_cast<double>(predicted), 0.03 * predicted);
    }
  }
}

// A model that reads a value in its forward, or takes a boolean mask, can't be planned without
// its values: the error names the operator.
TEST(ModeledDeviceTest, ReadingValuesIsRefusedWithTheOperatorsName) {
  ckpt::DeviceProfile profile = cpu_profile();
  const ckpt::ModeledDevice device(profile);
  const auto x = torch::empty({4, 8}, torch::kMeta);
  CKPT_EXPECT_THROWS_WITH(x.sum().item<float>(), "aten::_local_scalar_dense reads tensor values");
  CKPT_EXPECT_THROWS_WITH(x.index({x > 0}), "reads tensor values");
  CKPT_EXPECT_THROWS_WITH(x.nonzero(), "aten::nonzero reads tensor values");
  CKPT_EXPECT_THROWS_WITH(ckpt::ModeledDevice{profile}, "already active on this thread");
  // The meta allocation count is the process's: another thread may not model a device meanwhile.
  std::thread other(
      [&] { CKPT_EXPECT_THROWS_WITH(ckpt::ModeledDevice{profile}, "another thread models"); });
  other.join();
}

TEST(ModeledDeviceTest, AMetaSampleWithoutAModeledDeviceIsRefused) {
  auto model = build_model(model_config("small", /*quick=*/true));
  ckpt::move_to_meta(*model);
  for (const auto& p : model->parameters()) EXPECT_TRUE(p.is_meta());
  CKPT_EXPECT_THROWS_WITH(ckpt::profile_chain(stages_of(model), torch::empty({4, 8}, torch::kMeta)),
                          "profile it under a ckpt::ModeledDevice");
}

TEST(ModeledDeviceTest, ADeviceProfileRoundTripsThroughItsFileAndBadFilesSayWhy) {
  ckpt::DeviceProfile profile = cpu_profile();
  profile.memory_bytes = int64_t{80} << 30;
  profile.flops_per_second = 9.89e14;
  const std::string path = ::testing::TempDir() + "device.json";
  profile.save(path);
  const auto read = ckpt::DeviceProfile::load(path);
  EXPECT_EQ(read.name, profile.name);
  EXPECT_EQ(read.memory_bytes, profile.memory_bytes);
  EXPECT_EQ(read.flops_per_second, profile.flops_per_second);
  EXPECT_EQ(read.count_cpu_scratch, profile.count_cpu_scratch);
  EXPECT_GT(read.random_state_bytes, 0);
  EXPECT_EQ(read.random_state_bytes, profile.random_state_bytes);
  CKPT_EXPECT_THROWS_WITH(ckpt::DeviceProfile::load(path + ".missing"), "can't read");
  {
    std::ofstream out(path);
    out << R"({"name": "x", "memory_bytes": 1})";
  }
  CKPT_EXPECT_THROWS_WITH(ckpt::DeviceProfile::load(path), "has no \"allocation_granularity\"");
  {
    std::ofstream out(path);
    out << R"({"name": "x", "memory_bytes": 1, "allocation_granularity": 1,
               "flops_per_second": 1e12, "bytes_per_second": 1e11, "seconds_per_operator": 0,
               "random_state_bytes": -1})";
  }
  CKPT_EXPECT_THROWS_WITH(ckpt::DeviceProfile::load(path), "random_state_bytes must be at least 0");
}

// PlannedModel's profiler too: a U-Net whose blocks mark candidates, profiled on the meta device,
// predicts the peaks of its real profile for the same choices.
TEST(ModeledDeviceTest, AMetaProfileOfAMarkedModelPredictsTheRealProfilesPeaks) {
  const auto config = ckpt::models::unet_config(/*quick=*/true);
  auto model = ckpt::models::make_unet(config);
  const at::Tensor x = ckpt::models::unet_input(config);
  const auto real =
      ckpt::profile_model(model.ptr(), [&] { return model->forward(x).pow(2).mean(); });

  auto meta = ckpt::models::make_unet(config);
  ckpt::move_to_meta(*meta);
  const at::Tensor meta_x = torch::empty(x.sizes(), x.options().device(torch::kMeta));
  const ckpt::ModeledDevice device(cpu_profile());
  const auto modeled =
      ckpt::profile_model(meta.ptr(), [&] { return meta->forward(meta_x).pow(2).mean(); });

  ASSERT_EQ(modeled.profile.candidates.size(), real.profile.candidates.size());
  const int64_t smallest = ckpt::plan::min_model_budget(modeled.profile);
  const int64_t largest =
      ckpt::plan::simulate_model(modeled.profile,
                                 std::vector<int>(modeled.profile.candidates.size(), 0))
          .peak_bytes;
  for (int64_t budget : {smallest, (smallest + largest) / 2, largest}) {
    const auto plan = ckpt::plan::solve_model(modeled.profile, budget);
    ASSERT_TRUE(plan.feasible) << budget;
    const int64_t on_real = ckpt::plan::simulate_model(real.profile, plan.choice).peak_bytes;
    EXPECT_LE(ckpt::test::relative_difference(plan.prediction.peak_bytes, on_real), 0.02)
        << "budget " << budget << ": modeled " << plan.prediction.peak_bytes << ", real "
        << on_real;
  }
}

// The pieces a meta profile stands on: allocations counted with the device's granularity, an
// operator without a meta kernel (relu, in C++) run on the CPU with its shapes, an in-place one
// returning its own argument, and the clock charging a matrix product by its arithmetic.
TEST(ModeledDeviceTest, MetaAllocationsOperatorsWithoutMetaKernelsAndTheClock) {
  ckpt::DeviceProfile profile = cpu_profile();
  profile.allocation_granularity = 512;
  profile.flops_per_second = 1e9;
  profile.bytes_per_second = 1e15;
  profile.seconds_per_operator = 0;
  const ckpt::ModeledDevice device(profile);
  ckpt::MemoryTracker tracker(torch::kMeta);
  const int64_t before = tracker.current_bytes();
  torch::Tensor small = torch::empty({3}, torch::kMeta);  // 12 bytes: one block
  EXPECT_EQ(tracker.current_bytes() - before, 512);
  const torch::Tensor a = torch::empty({64, 128}, torch::kMeta);
  const torch::Tensor b = torch::empty({128, 32}, torch::kMeta);
  const double start = device.seconds();
  const torch::Tensor product = torch::mm(a, b);
  EXPECT_NEAR(device.seconds() - start, 2.0 * 64 * 128 * 32 / 1e9, 1e-9);
  EXPECT_EQ(product.sizes(), (std::vector<int64_t>{64, 32}));
  const torch::Tensor relu = torch::relu(product);
  EXPECT_TRUE(relu.is_meta());
  EXPECT_EQ(relu.sizes(), product.sizes());
  torch::Tensor in_place = product.clone();
  EXPECT_TRUE(torch::relu_(in_place).is_same(in_place));
  const int64_t with_small = tracker.current_bytes();
  small.reset();  // freeing gives its block back
  EXPECT_EQ(tracker.current_bytes(), with_small - 512);
}

// An operator without a meta kernel runs on zero-filled CPU tensors once per call of its kind: a
// call with the same arguments' geometry and values takes that answer again (the same meta
// outputs and the same scratch charged) without running the kernel; another geometry runs it.
// Its in-place form still returns its argument from the answer kept.
TEST(ModeledDeviceTest, AnOperatorWithoutAMetaKernelRunsOnTheCpuOncePerKindOfCall) {
  const ckpt::ModeledDevice device(cpu_profile());
  ckpt::MemoryTracker cpu(torch::kCPU, ckpt::MemoryScope::CallingThread);
  ckpt::MemoryTracker meta(torch::kMeta);
  const auto call = [&](const torch::Tensor& x) {
    cpu.reset_peak();
    meta.reset_peak();
    const int64_t cpu_before = cpu.current_bytes();
    const int64_t meta_before = meta.current_bytes();
    const torch::Tensor y = torch::relu(x);
    EXPECT_TRUE(y.is_meta());
    EXPECT_EQ(y.sizes(), x.sizes());
    EXPECT_EQ(y.strides(), x.strides());
    return std::make_pair(cpu.peak_bytes() - cpu_before, meta.peak_bytes() - meta_before);
  };
  const torch::Tensor x = torch::empty({32, 48}, torch::kMeta);
  const auto first = call(x);
  EXPECT_GT(first.first, 0) << "the kernel ran on CPU tensors";
  const auto again = call(torch::empty({32, 48}, torch::kMeta));
  EXPECT_EQ(again.first, 0) << "nothing ran on the CPU";
  EXPECT_EQ(again.second, first.second) << "the same meta allocations";
  EXPECT_GT(call(torch::empty({48, 32}, torch::kMeta)).first, 0) << "another shape runs it";
  EXPECT_GT(call(x.t()).first, 0) << "other strides run it";
  torch::Tensor in_place = torch::empty({32, 48}, torch::kMeta);
  EXPECT_TRUE(torch::relu_(in_place).is_same(in_place));
  EXPECT_TRUE(torch::relu_(in_place).is_same(in_place)) << "the kept answer: its argument";
}

}  // namespace modeled_device_test
