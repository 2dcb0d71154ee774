#pragma once

#include <c10/core/Device.h>

#include <cstdint>

namespace ckpt {

namespace detail {
struct ThreadCounter;
}  // namespace detail

/// Whose allocations a MemoryTracker counts.
enum class MemoryScope {
  /// Every thread's (the default).
  Process,
  /// Only those the constructing thread makes (CPU only): other threads' work, concurrent
  /// profiling say, does not move its counts. Blocks it allocated still count down when another
  /// thread frees them. LibTorch runs a CPU backward pass on the calling thread; scratch buffers
  /// of intra-op worker threads are not counted.
  CallingThread,
};

/// Counts the bytes that live tensors hold on a device.
///
/// On the CPU (the default), the first tracker constructed in a process installs a counting
/// allocator with `c10::SetCPUAllocator`; it stays installed for the life of the process and
/// forwards to the allocator that was there before. Only memory allocated after that point is
/// counted. CPU trackers are thread-safe, and each keeps its own peak.
///
/// On an accelerator (CUDA, XPU, ...; LibTorch 2.9 or later), a tracker reads the caching
/// allocator's statistics: bytes allocated to tensors now, and their high-water mark. That mark
/// is one per device, so constructing a tracker or calling `reset_peak()` restarts it for every
/// tracker of the device. Where a device's memory can't be measured, the constructor raises an
/// error (`can_measure` tells beforehand); it never reports zero.
///
/// Example:
/// ```
/// ckpt::MemoryTracker tracker;
/// const int64_t before = tracker.current_bytes();
/// model->forward(x).sum().backward();
/// std::cout << "peak: " << tracker.peak_bytes() - before << " bytes\n";
/// ```
class MemoryTracker {
 public:
  /// Tracks `device` (CPU by default; an accelerator without an index means index 0), counting
  /// the allocations of `scope`.
  explicit MemoryTracker(c10::Device device = c10::Device(c10::DeviceType::CPU),
                         MemoryScope scope = MemoryScope::Process);
  ~MemoryTracker();
  MemoryTracker(const MemoryTracker&) = delete;
  MemoryTracker& operator=(const MemoryTracker&) = delete;

  /// Whether trackers can measure `device` with this LibTorch build.
  static bool can_measure(c10::Device device);

  /// The device whose memory this tracker counts.
  c10::Device device() const { return device_; }

  /// Bytes allocated on the device and still live: process-wide, or allocated by the tracker's
  /// thread since it began counting (MemoryScope::CallingThread).
  int64_t current_bytes() const;
  /// High-water mark of `current_bytes()` since construction or the last `reset_peak()`.
  int64_t peak_bytes() const;
  /// Starts a new high-water mark at the current value.
  void reset_peak();

 private:
  c10::Device device_;
  int slot_ = -1;                            // the CPU allocator's peak slot; -1 on an accelerator
  detail::ThreadCounter* thread_ = nullptr;  // MemoryScope::CallingThread
};

}  // namespace ckpt
