#pragma once

// The emulated accelerator's device guard: current device and stream per thread, streams and
// events (streams.h). Registered for PrivateUse1, it is what DeviceGuard, StreamGuard, c10::Event
// and the autograd engine use; its deviceCount() makes the engine start a thread per device.

#include "compat/device_backend.h"

namespace ckpt {
namespace emulated_device {
namespace detail {

class Guard final : public compat::DeviceGuardBase {
 public:
  c10::DeviceType type() const override { return c10::DeviceType::PrivateUse1; }
  c10::Device exchangeDevice(c10::Device device) const override;
  c10::Device getDevice() const override;
  void setDevice(c10::Device device) const override;
  void uncheckedSetDevice(c10::Device device) const noexcept override;
  c10::DeviceIndex deviceCount() const noexcept override;

  c10::Stream getStream(c10::Device device) const noexcept override;
  c10::Stream getDefaultStream(c10::Device device) const override;
  c10::Stream getStreamFromGlobalPool(c10::Device device, bool high_priority) const override;
  c10::Stream exchangeStream(c10::Stream stream) const noexcept override;
  bool queryStream(const c10::Stream& stream) const override;
  void synchronizeStream(const c10::Stream& stream) const override;

  void record(void** event, const c10::Stream& stream, c10::DeviceIndex device,
              c10::EventFlag flag) const override;
  void block(void* event, const c10::Stream& stream) const override;
  bool queryEvent(void* event) const override;
  void destroyEvent(void* event, c10::DeviceIndex device) const noexcept override;

  c10::Stream new_stream(c10::Device device) const override;
  void synchronize_event(void* event) const override;
  void synchronize_device(c10::DeviceIndex device) const override;
  double elapsed_milliseconds(void* first, void* second) const override;
};

}  // namespace detail
}  // namespace emulated_device
}  // namespace ckpt
