#pragma once

// The emulated accelerator's devices: how many there are, which one is current on each thread,
// and which ones have been used.

#include <c10/core/Device.h>

namespace ckpt {
namespace emulated_device {
namespace detail {

/// The most devices install() accepts.
constexpr int kMaxDevices = 16;

/// The number of devices install() registered (0 before).
c10::DeviceIndex count();
void set_count(c10::DeviceIndex devices);

/// Raises a clear error unless `index` names one of the devices.
void check_index(c10::DeviceIndex index);

/// The calling thread's current device (0 unless set), and setting it.
c10::DeviceIndex current();
void set_current(c10::DeviceIndex index);

/// `index`, or the current device for -1.
c10::DeviceIndex resolve(c10::DeviceIndex index);

/// The device, as a c10::Device.
inline c10::Device device_of_index(c10::DeviceIndex index) {
  return c10::Device(c10::DeviceType::PrivateUse1, index);
}

/// Marks a device as used (memory allocated or its generator read): CUDA's primary context.
void mark_used(c10::DeviceIndex index);
bool used(c10::DeviceIndex index);

}  // namespace detail
}  // namespace emulated_device
}  // namespace ckpt
