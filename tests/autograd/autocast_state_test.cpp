// The autocast state a region replays: the CPU's and that of the arguments' device type, for every
// accelerator type autocast knows in this LibTorch (2.x: device-generic; 1.13: CPU and CUDA).

#include "autograd/autocast_state.h"
#include "support/support.h"

namespace autocast_state_test {

using ckpt::detail::AutocastScope;
using ckpt::detail::AutocastState;

// Sets a device type's autocast flag and dtype for its lifetime; puts them back afterwards.
class AutocastSetting {
 public:
  AutocastSetting(c10::DeviceType type, bool enabled, c10::ScalarType dtype)
      : type_(type),
        enabled_(ckpt::compat::autocast_enabled(type)),
        dtype_(ckpt::compat::autocast_dtype(type)) {
    ckpt::compat::set_autocast_enabled(type, enabled);
    ckpt::compat::set_autocast_dtype(type, dtype);
  }
  ~AutocastSetting() {
    ckpt::compat::set_autocast_enabled(type_, enabled_);
    ckpt::compat::set_autocast_dtype(type_, dtype_);
  }

 private:
  c10::DeviceType type_;
  bool enabled_;
  c10::ScalarType dtype_;
};

void expect_replayed_for(c10::DeviceType type) {
  SCOPED_TRACE(c10::DeviceTypeName(type));
  AutocastState forward;
  {
    const AutocastSetting during_forward(type, true, torch::kBFloat16);
    forward = AutocastState::current(type);
  }
  ASSERT_TRUE(forward.has_device);
  EXPECT_EQ(forward.device.type, type);
  EXPECT_TRUE(forward.device.enabled);
  EXPECT_EQ(forward.device.dtype, torch::kBFloat16);

  const bool before = ckpt::compat::autocast_enabled(type);
  EXPECT_FALSE(before);
  {
    const AutocastScope recompute(forward);
    EXPECT_TRUE(ckpt::compat::autocast_enabled(type));
    EXPECT_EQ(ckpt::compat::autocast_dtype(type), torch::kBFloat16);
  }
  EXPECT_EQ(ckpt::compat::autocast_enabled(type), before);
}

TEST(AutocastStateTest, CudaStateIsCapturedAndReplayed) {
  expect_replayed_for(c10::DeviceType::CUDA);
}

TEST(AutocastStateTest, EveryAcceleratorTypeAutocastKnowsIsCapturedAndReplayed) {
  // XPU, MPS, HPU, XLA, PrivateUse1: their autocast flags exist without their runtimes.
  int known = 0;
  for (auto type : {c10::DeviceType::XPU, c10::DeviceType::MPS, c10::DeviceType::HPU,
                    c10::DeviceType::XLA, c10::DeviceType::PrivateUse1}) {
    if (!ckpt::compat::autocast_available(type)) {
      EXPECT_FALSE(AutocastState::current(type).has_device);
      continue;
    }
    ++known;
    expect_replayed_for(type);
  }
  // LibTorch 2.4+ knows them all through the device-generic API; 1.13 knows none of them.
  EXPECT_EQ(known, CKPT_TORCH_AT_LEAST(2, 4) ? 5 : 0);
}

}  // namespace autocast_state_test
