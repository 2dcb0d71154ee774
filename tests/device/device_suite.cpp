#include "device_suite.h"

#include <ckpt/memory_tracker.h>

#include <ATen/autocast_mode.h>

#include <mutex>

namespace ckpt {
namespace test {

void DeviceTest::SetUp() {
  if (type() == c10::DeviceType::CUDA && !torch::cuda::is_available()) {
    GTEST_SKIP() << "no CUDA device is present";
  }
  if (type() == c10::DeviceType::PrivateUse1 && !emulated_device::installed()) {
    GTEST_SKIP() << "the emulated device is not installed";
  }
  seed(0);
}

int DeviceTest::device_count() const {
  return c10::impl::getDeviceGuardImpl(type())->deviceCount();
}

std::optional<std::string> DeviceTest::missing_rng() const {
  if (type() == c10::DeviceType::PrivateUse1 && !emulated_device::has_accelerator_hooks()) {
    return "LibTorch " TORCH_VERSION
           " has no generator hooks for PrivateUse1: ckpt can't stash "
           "the emulated device's RNG";
  }
  return std::nullopt;
}

std::optional<std::string> DeviceTest::missing_autocast() const {
  if (!compat::autocast_available(type())) {
    return std::string("LibTorch " TORCH_VERSION " has no autocast for ") +
           c10::DeviceTypeName(type(), /*lower_case=*/true);
  }
  return std::nullopt;
}

std::optional<std::string> DeviceTest::missing_memory_statistics() const {
  if (!compat::device_memory_measurable(type())) {
    return "LibTorch " TORCH_VERSION " has no device-generic allocator statistics";
  }
  return std::nullopt;
}

at::Generator DeviceTest::generator(int index) const {
  // The emulated device's own accessor works where LibTorch has no hooks for it.
  if (type() == c10::DeviceType::PrivateUse1) return emulated_device::default_generator(index);
  return compat::default_generator(device(index));
}

at::Tensor DeviceTest::rng_state(int index) const {
  at::Generator g = generator(index);
  std::lock_guard<std::mutex> lock(g.mutex());
  return g.get_state();
}

void DeviceTest::set_rng_state(int index, const at::Tensor& state) const {
  at::Generator g = generator(index);
  std::lock_guard<std::mutex> lock(g.mutex());
  g.set_state(state);
}

void DeviceTest::seed(uint64_t value) const {
  torch::manual_seed(value);  // the CPU's, and the current accelerator's where LibTorch has one
  for (int i = 0; i < device_count(); ++i) {
    at::Generator g = generator(i);
    std::lock_guard<std::mutex> lock(g.mutex());
    g.set_current_seed(value);
  }
}

AutocastOn::AutocastOn(c10::DeviceType type)
    : type_(type), previous_(compat::autocast_enabled(type)) {
  compat::set_autocast_enabled(type_, true);
  at::autocast::increment_nesting();
}

AutocastOn::~AutocastOn() {
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  compat::set_autocast_enabled(type_, previous_);
}

std::string DeviceName::operator()(const ::testing::TestParamInfo<c10::DeviceType>& info) const {
  return info.param == c10::DeviceType::CUDA ? "CUDA" : "Emulated";
}

void expect_step_peak_as_predicted(PlannedSequential& planned, const at::Tensor& x,
                                   const at::Tensor& target) {
  MemoryTracker tracker(x.device());
  const int64_t scalar_bytes = [&] {
    const int64_t before = tracker.current_bytes();
    const auto scalar = torch::zeros({}, torch::TensorOptions().device(x.device()));
    return tracker.current_bytes() - before;
  }();
  tracker.reset_peak();
  const int64_t before = tracker.current_bytes() - x.nbytes();
  {
    const auto loss = (planned(x) * target).sum();
    loss.backward();
  }
  const int64_t measured = tracker.peak_bytes() - before - 2 * scalar_bytes;
  const int64_t predicted = planned->prediction().peak_bytes;
  EXPECT_LE(measured, planned->budget_bytes());
  EXPECT_NEAR(static_cast<double>(measured), static_cast<double>(predicted), 0.02 * predicted)
      << "measured " << measured << " predicted " << predicted;
}

}  // namespace test
}  // namespace ckpt
