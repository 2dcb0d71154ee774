#pragma once

// The emulated accelerator's memory: host memory, allocated per device and counted the way CUDA's
// caching allocator counts it (each block rounded up to 512 bytes), without the cache.

#include "compat/device_backend.h"
#include "devices.h"

#include <c10/core/Allocator.h>
#include <c10/core/Device.h>
#include <c10/core/Storage.h>

#include <array>
#include <mutex>
#include <unordered_map>

namespace ckpt {
namespace emulated_device {
namespace detail {

class DeviceMemory final : public compat::DeviceAllocatorBase {
 public:
  /// The one instance, registered with c10::SetAllocator for PrivateUse1.
  static DeviceMemory& instance();

  c10::DeleterFnPtr raw_deleter() const override { return &free_block; }

  /// A block of `bytes` bytes on `device`.
  c10::DataPtr allocate_on(c10::DeviceIndex device, size_t bytes) const;

  /// The device whose memory holds `data` (a block's start, as getDeviceFromPtr is asked).
  c10::Device device_of(const void* data) const;

  /// Gives `storage` (of an emulated device) `bytes` bytes, keeping the contents that fit.
  void resize(const c10::Storage& storage, size_t bytes) const;

  compat::AllocatorStats stats(c10::DeviceIndex device) const override;
  void reset_peak(c10::DeviceIndex device) const override;
  void reset_accumulated(c10::DeviceIndex device) const override;

  /// Each device's capacity from now on: an allocation that would take a device past it raises
  /// LibTorch's OutOfMemoryError. `bytes` <= 0: no limit.
  void set_limit(int64_t bytes);

 protected:
  /// A block on the calling thread's current device.
  c10::DataPtr allocate_bytes(size_t bytes) const override;

 private:
  DeviceMemory() = default;
  static void free_block(void* data);

  struct Block {
    c10::DeviceIndex device;
    size_t bytes;  // rounded
  };
  mutable std::mutex mutex_;
  mutable std::unordered_map<const void*, Block> blocks_;
  mutable std::array<compat::AllocatorStats, kMaxDevices> stats_{};
  int64_t limit_ = 0;  // guarded by mutex_; 0: none
};

}  // namespace detail
}  // namespace emulated_device
}  // namespace ckpt
