// Planning without the device, against the device (issue 51, item 3): a meta profile under a
// ModeledDevice with the accelerator's granularity predicts the peaks of a profile measured on it,
// for every bench model.

#include <ckpt/modeled_device.h>
#include <ckpt/plan/simulator.h>
#include <ckpt/plan/solvers.h>
#include <ckpt/profiler.h>

#include "bench_models.h"
#include "device/device_suite.h"

#include <cmath>
#include <string>
#include <vector>

namespace {

class ModeledDeviceOnDeviceTest : public ckpt::test::DeviceTest {
 protected:
  void SetUp() override {
    DeviceTest::SetUp();
    if (IsSkipped()) return;
    CKPT_SKIP_IF(missing_memory_statistics());
  }
};

double relative_difference(int64_t modeled, int64_t real) {
  return std::abs(static_cast<double>(modeled - real)) / static_cast<double>(real);
}

TEST_P(ModeledDeviceOnDeviceTest, AMetaProfileOfEveryBenchModelPredictsTheDevicesPeaks) {
  ckpt::DeviceProfile profile;  // an accelerator's allocator: blocks of 512 bytes
  profile.name = "modeled accelerator";
  profile.allocation_granularity = 512;
  for (const std::string& name : ckpt::models::model_names()) {
    SCOPED_TRACE(name);
    const auto config = ckpt::models::model_config(name, /*quick=*/true);
    auto model = ckpt::models::build_model(config);
    model->to(device());
    const auto x = ckpt::models::make_input(config).to(device());
    const auto real = ckpt::profile_chain({model->begin(), model->end()}, x);

    auto meta = ckpt::models::build_model(config);
    ckpt::move_to_meta(*meta);
    ckpt::plan::Chain modeled;
    {
      const ckpt::ModeledDevice modeled_device(profile);
      modeled = ckpt::profile_chain({meta->begin(), meta->end()},
                                    torch::empty(x.sizes(), x.options().device(torch::kMeta)));
    }
    ckpt::plan::OptimalOptions options;
    const int64_t smallest = ckpt::plan::min_feasible_budget_bytes(modeled, options);
    const int64_t largest =
        ckpt::plan::simulate(modeled, ckpt::plan::solve_no_checkpoint(modeled)).peak_bytes;
    for (int64_t budget : {smallest, (smallest + largest) / 2, largest}) {
      const auto plan = ckpt::plan::solve_optimal(modeled, budget, options);
      ASSERT_TRUE(plan.has_value()) << budget;
      const int64_t predicted = ckpt::plan::simulate(modeled, *plan).peak_bytes;
      const int64_t on_device = ckpt::plan::simulate(real, *plan).peak_bytes;
      EXPECT_LE(relative_difference(predicted, on_device), 0.02)
          << "budget " << budget << ": modeled " << predicted << ", on the device " << on_device;
    }
  }
}

CKPT_INSTANTIATE_DEVICE_SUITE(ModeledDeviceOnDeviceTest);

}  // namespace
