#pragma once

// The device suite: tests written once and instantiated for every accelerator type, the emulated
// one (ckpt::emulated_device, on every machine) and CUDA (where a GPU is: scripts/gpu-check.sh).
// An instance skips, saying why, where its device type is absent or where this LibTorch lacks
// what the test needs.

#include <ckpt/emulated_device.h>
#include <ckpt/planned_sequential.h>

#include "compat/torch_compat.h"
#include "support/support.h"

#include <optional>
#include <string>

namespace ckpt {
namespace test {

class DeviceTest : public ::testing::TestWithParam<c10::DeviceType> {
 protected:
  void SetUp() override;

  c10::DeviceType type() const { return GetParam(); }
  c10::Device device(int index = 0) const { return c10::Device(type(), index); }
  torch::TensorOptions on(int index = 0) const {
    return torch::TensorOptions().device(device(index));
  }
  int device_count() const;

  /// Why ckpt can't read and set this device type's generators here, if it can't (the emulated
  /// device on LibTorch 1.13, which has no generator hooks for PrivateUse1).
  std::optional<std::string> missing_rng() const;
  /// Why autocast has no state for this device type here, if it has none.
  std::optional<std::string> missing_autocast() const;
  /// Why ckpt can't measure this device's memory here, if it can't.
  std::optional<std::string> missing_memory_statistics() const;

  at::Generator generator(int index) const;
  at::Tensor rng_state(int index) const;
  void set_rng_state(int index, const at::Tensor& state) const;
  /// Seeds the CPU's generator and those of every device of the type.
  void seed(uint64_t value) const;
};

/// Autocast on for a device type while it lives, as Python's `torch.autocast(type)` context: on
/// exit the previous state is back and, leaving the outermost context, the cast cache is cleared.
class AutocastOn {
 public:
  explicit AutocastOn(c10::DeviceType type);
  ~AutocastOn();
  AutocastOn(const AutocastOn&) = delete;
  AutocastOn& operator=(const AutocastOn&) = delete;

 private:
  c10::DeviceType type_;
  bool previous_;
};

/// Runs one training step of `planned` on `x`, whose loss is `(planned(x) * target).sum()` (it
/// keeps nothing of the chain's output and materialises its gradient, as the planner's model
/// has it), and expects the step's measured device peak within 2% of the plan's prediction and
/// within its budget. The peak is above what lived before the step, with x_0 counted (as in the
/// model) and the loss's two scalars (the caller's) not.
void expect_step_peak_as_predicted(PlannedSequential& planned, const at::Tensor& x,
                                   const at::Tensor& target);

/// "Emulated" or "CUDA": the instance's name.
struct DeviceName {
  std::string operator()(const ::testing::TestParamInfo<c10::DeviceType>& info) const;
};

}  // namespace test
}  // namespace ckpt

/// Instantiates a suite derived from DeviceTest for every device type.
#define CKPT_INSTANTIATE_DEVICE_SUITE(Suite)                                                       \
  INSTANTIATE_TEST_SUITE_P(Devices, Suite,                                                         \
                           ::testing::Values(c10::DeviceType::PrivateUse1, c10::DeviceType::CUDA), \
                           ::ckpt::test::DeviceName())

/// Skips the calling test when `reason` (an optional string) holds a reason.
#define CKPT_SKIP_IF(reason)                               \
  do {                                                     \
    if (const auto why_ = (reason)) GTEST_SKIP() << *why_; \
  } while (0)

/// Skips the calling test where the device type has fewer than two devices.
#define CKPT_SKIP_WITHOUT_TWO_DEVICES()                                 \
  do {                                                                  \
    if (device_count() < 2)                                             \
      GTEST_SKIP() << "needs 2 devices of this type, and this machine " \
                      "has "                                            \
                   << device_count();                                   \
  } while (0)
