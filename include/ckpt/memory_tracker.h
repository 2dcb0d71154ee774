#pragma once

#include <cstdint>

namespace ckpt {

/// Counts the bytes that live tensors hold through LibTorch's CPU allocator.
///
/// The first tracker constructed in a process installs a counting allocator with
/// `c10::SetCPUAllocator`; it stays installed for the life of the process and forwards to the
/// allocator that was there before. Only memory allocated after that point is counted. Trackers
/// are thread-safe, and each keeps its own peak.
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
  MemoryTracker();
  ~MemoryTracker();
  MemoryTracker(const MemoryTracker&) = delete;
  MemoryTracker& operator=(const MemoryTracker&) = delete;

  /// Bytes allocated through the counting allocator and still live (process-wide).
  int64_t current_bytes() const;
  /// High-water mark of `current_bytes()` since construction or the last `reset_peak()`.
  int64_t peak_bytes() const;
  /// Starts a new high-water mark at the current value.
  void reset_peak();

 private:
  int slot_;
};

}  // namespace ckpt
