#pragma once

// An emulated accelerator for testing device-generic LibTorch code on any machine: CMake target
// ckpt::emulated_device. See docs/emulated-device.md.

#include <ATen/core/Generator.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include <cstdint>
#include <string>

namespace ckpt {
namespace emulated_device {

/// Registers an emulated accelerator with `devices` devices as `c10::DeviceType::PrivateUse1`.
///
/// Its memory is host memory; operators run LibTorch's CPU kernels on it; each device has its own
/// default generator, streams and events, and a statistics-keeping allocator. On LibTorch 2.9 and
/// later it is also LibTorch's current accelerator (`at::getAccelerator()`), under the name
/// "emulated": `torch::manual_seed` seeds its generators, autocast knows it, and
/// `c10::DeviceAllocator` gives its memory statistics.
///
/// Call it before the process's first backward pass: the autograd engine starts its per-device
/// threads then, and a later install() raises an error. Calling it again with the same count does
/// nothing; with another count, or when another backend holds PrivateUse1, it raises an error.
///
/// Example:
/// ```
/// ckpt::emulated_device::install();
/// auto x = torch::ones({2, 3}, torch::TensorOptions().device(ckpt::emulated_device::device(1)));
/// ```
void install(int devices = 2);

/// Whether install() has registered the emulated accelerator in this process.
bool installed();

/// The number of devices install() registered (0 before).
int device_count();

/// Device `index` of the emulated accelerator: `c10::Device(c10::DeviceType::PrivateUse1, index)`.
c10::Device device(int index = 0);

/// The name of the device type in device strings: "emulated" on LibTorch 2.9 and later,
/// "privateuseone" before (where backends can't register a name).
std::string name();

/// Whether LibTorch's device-generic code knows the emulated accelerator: its default generators,
/// manual_seed, autocast and allocator statistics (LibTorch 2.9 and later).
bool has_accelerator_hooks();

/// The default random generator of device `index`: what operators on the device draw from (and,
/// on LibTorch 2.9 and later, `at::globalContext().defaultGenerator(device(index))`). Its state is
/// a CPU generator's state.
at::Generator default_generator(int index);

/// Memory held by live tensors on one device, counted as CUDA's caching allocator counts it: each
/// allocation rounded up to a multiple of 512 bytes. There is no cache: freed memory goes back to
/// the host at once.
struct MemoryStats {
  int64_t allocated_bytes = 0;       ///< now
  int64_t peak_allocated_bytes = 0;  ///< high-water mark since install() or reset_peak_memory()
  int64_t allocations = 0;           ///< live allocations now
};

/// The memory statistics of device `index` (also `c10::DeviceAllocator::getDeviceStats` on
/// LibTorch 2.9 and later).
MemoryStats memory_stats(int index);

/// Restarts device `index`'s high-water mark at what is allocated now.
void reset_peak_memory(int index);

/// Gives every device of the emulated accelerator a capacity of `bytes` (counted as
/// memory_stats() counts) from now on: an allocation that would take a device past it raises
/// LibTorch's own out-of-memory error (`c10::OutOfMemoryError`), as a full GPU does. Memory
/// already allocated stays. `bytes` <= 0 removes the limit. For testing code that must survive
/// running out of memory (`ckpt::OutOfMemory::Replan`).
///
/// Example:
/// ```
/// ckpt::emulated_device::set_memory_limit(int64_t{64} << 20);  // 64 MiB per device
/// // ... a step that needs more raises c10::OutOfMemoryError
/// ckpt::emulated_device::set_memory_limit(0);  // no limit
/// ```
void set_memory_limit(int64_t bytes);

/// A test hook: while it lives, work enqueued on `stream` (a non-default stream of the emulated
/// device) does not run, so a test can observe what a missing wait would read.
///
/// Example:
/// ```
/// auto stream = c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1)
///                   ->getStreamFromGlobalPool(ckpt::emulated_device::device(0));
/// {
///   ckpt::emulated_device::StreamHold hold(stream);
///   // copies enqueued on `stream` here have not run yet
/// }
/// ```
class StreamHold {
 public:
  explicit StreamHold(c10::Stream stream);
  ~StreamHold();
  StreamHold(const StreamHold&) = delete;
  StreamHold& operator=(const StreamHold&) = delete;

 private:
  c10::Stream stream_;
};

}  // namespace emulated_device
}  // namespace ckpt
