#pragma once

// What registering an accelerator backend as c10::DeviceType::PrivateUse1 takes in each supported
// LibTorch. Used by the emulated device (src/emulated_device/), which has no version test of its
// own. From 2.9 a PrivateUse1 backend registers a name, accelerator hooks (device count, default
// generators) and a c10::DeviceAllocator, which LibTorch's device-generic code and ckpt read.
// Before, it has a device guard, an allocator and kernels only: LibTorch's default generators,
// manual_seed, autocast and allocator statistics don't know it.

#include "version.h"

#include <ATen/core/Generator.h>
#include <c10/core/Allocator.h>
#include <c10/core/Device.h>
#include <c10/core/GeneratorImpl.h>
#include <c10/core/Storage.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#if CKPT_TORCH_AT_LEAST(2, 9)
#include <c10/core/CachingDeviceAllocator.h>
#endif

#include <cstdint>
#include <string>

namespace ckpt {
namespace compat {

/// Whether this LibTorch lets a PrivateUse1 backend register hooks, generators and allocator
/// statistics (2.9 and newer).
constexpr bool kPrivateUse1Hooks = CKPT_TORCH_AT_LEAST(2, 9);

// ~~~ Allocator ~~~

/// One statistic of a device allocator, as LibTorch's caching allocators keep them.
struct AllocatorStat {
  int64_t current = 0;
  int64_t peak = 0;
  int64_t allocated = 0;  // total ever added
  int64_t freed = 0;      // total ever removed
};

/// Bytes and blocks held by live allocations of one device.
struct AllocatorStats {
  AllocatorStat bytes;
  AllocatorStat blocks;
};

#if CKPT_TORCH_AT_LEAST(2, 9)
using DeviceAllocatorParent = c10::DeviceAllocator;
#else
using DeviceAllocatorParent = c10::Allocator;
#endif

/// Base of a device allocator: a c10::DeviceAllocator from 2.9 (its statistics are what
/// `c10::DeviceAllocator::getDeviceStats` returns), a plain c10::Allocator before. Derived classes
/// implement the protected functions.
class DeviceAllocatorBase : public DeviceAllocatorParent {
 public:
#if CKPT_TORCH_AT_LEAST(2, 3)
  c10::DataPtr allocate(size_t bytes) final {
    return allocate_bytes(bytes);
  }
  void copy_data(void* dest, const void* src, std::size_t count) const final;
#else
  c10::DataPtr allocate(size_t bytes) const final {
    return allocate_bytes(bytes);
  }
#endif
#if CKPT_TORCH_AT_LEAST(2, 9)
  bool initialized() override {
    return true;
  }
  void emptyCache(c10::MempoolId_t /*mempool_id*/) override {}
  void recordStream(const c10::DataPtr& /*ptr*/, c10::Stream /*stream*/) override {}
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override;
  void resetAccumulatedStats(c10::DeviceIndex device) override {
    reset_accumulated(device);
  }
  void resetPeakStats(c10::DeviceIndex device) override {
    reset_peak(device);
  }
#endif

 protected:
  virtual c10::DataPtr allocate_bytes(size_t bytes) const = 0;
  virtual AllocatorStats stats(c10::DeviceIndex device) const = 0;
  virtual void reset_peak(c10::DeviceIndex device) const = 0;
  virtual void reset_accumulated(c10::DeviceIndex device) const = 0;
};

// ~~~ Generator ~~~

/// Base of a device's random generator: 2.x added offsets to c10::GeneratorImpl.
class DeviceGeneratorBase : public c10::GeneratorImpl {
 public:
  using c10::GeneratorImpl::GeneratorImpl;
#if CKPT_TORCH_AT_LEAST(2, 9)
  void set_offset(uint64_t offset) override {
    set_offset_value(offset);
  }
  uint64_t get_offset() const override {
    return offset_value();
  }
#endif

 protected:
  virtual void set_offset_value(uint64_t offset) = 0;
  virtual uint64_t offset_value() const = 0;
};

// ~~~ Device guard ~~~

/// Base of a device guard with streams and events: 2.x added new streams, event and device
/// synchronization and event timing to the interface. Derived classes implement the protected
/// functions (reachable through their own API where LibTorch has no such virtual).
class DeviceGuardBase : public c10::impl::DeviceGuardImplInterface {
 public:
#if CKPT_TORCH_AT_LEAST(2, 9)
  c10::Stream getNewStream(c10::Device device, int /*priority*/) const override {
    return new_stream(device);
  }
  void synchronizeEvent(void* event) const override {
    synchronize_event(event);
  }
  void synchronizeDevice(c10::DeviceIndex device) const override {
    synchronize_device(device);
  }
  double elapsedTime(void* first, void* second, c10::DeviceIndex /*device*/) const override {
    return elapsed_milliseconds(first, second);
  }
#endif

  virtual c10::Stream new_stream(c10::Device device) const = 0;
  virtual void synchronize_event(void* event) const = 0;
  virtual void synchronize_device(c10::DeviceIndex device) const = 0;
  virtual double elapsed_milliseconds(void* first, void* second) const = 0;
};

// ~~~ Backend registration ~~~

/// What a PrivateUse1 backend tells LibTorch's accelerator hooks (2.9+).
class BackendRuntime {
 public:
  virtual ~BackendRuntime() = default;
  virtual c10::DeviceIndex device_count() const = 0;
  virtual c10::DeviceIndex current_device() const = 0;
  virtual void set_current_device(c10::DeviceIndex device) const = 0;
  virtual const at::Generator& default_generator(c10::DeviceIndex device) const = 0;
  /// Whether the device has been used (CUDA's "primary context").
  virtual bool device_used(c10::DeviceIndex device) const = 0;
  virtual c10::Device device_of(const void* data) const = 0;
  /// Gives `storage` `bytes` bytes of the device's memory, keeping its contents.
  virtual void resize_storage(const c10::Storage& storage, size_t bytes) const = 0;
};

/// The name under which another library registered PrivateUse1; empty when none did (always
/// empty before 2.9, where backends have no name).
std::string privateuse1_backend_name();

/// Whether accelerator hooks are registered for PrivateUse1 (always false before 2.9).
bool privateuse1_hooks_registered();

/// Registers `name` for PrivateUse1 (device strings "name:0"), and hooks that answer from
/// `runtime`, which must live for the process (2.9+; nothing before).
void register_privateuse1_backend(const std::string& name, const BackendRuntime& runtime);

/// Registers autocast for PrivateUse1 with CUDA's cast policies (2.9+; nothing before). Returns
/// whether autocast is available for the device.
bool register_privateuse1_autocast();

}  // namespace compat
}  // namespace ckpt
