#include <ckpt/memory_tracker.h>

#include "compat/torch_compat.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <array>
#include <atomic>
#include <mutex>

namespace ckpt {
namespace {

constexpr int kMaxTrackers = 64;
// Each block carries its size in a header; 64 bytes keep LibTorch's CPU alignment.
constexpr size_t kHeaderBytes = 64;

// Forwards to the previous CPU allocator and counts live bytes. Each live tracker owns a slot whose
// peak the allocator raises; slots are claimed and released under a mutex, the counters are atomic.
class CountingAllocator final : public compat::AllocatorBase {
 public:
  explicit CountingAllocator(c10::Allocator* inner) : inner_(inner) {
    for (auto& peak : peaks_) peak.store(-1);
  }

  c10::DataPtr allocate_bytes(size_t bytes) const override {
    if (bytes == 0) return inner_->allocate(0);
    void* base = inner_->raw_allocate(bytes + kHeaderBytes);
    *static_cast<size_t*>(base) = bytes;
    void* data = static_cast<char*>(base) + kHeaderBytes;
    record(static_cast<int64_t>(bytes));
    return {data, data, &CountingAllocator::free_block, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &CountingAllocator::free_block; }

  int64_t current() const { return current_.load(); }
  int64_t peak(int slot) const { return peaks_[slot].load(); }
  void reset_peak(int slot) { peaks_[slot].store(current_.load()); }

  int claim_slot() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (int slot = 0; slot < kMaxTrackers; ++slot) {
      if (peaks_[slot].load() < 0) {
        peaks_[slot].store(current_.load());
        return slot;
      }
    }
    TORCH_CHECK(false, "ckpt::MemoryTracker: at most ", kMaxTrackers,
                " trackers can be alive at once; destroy some before creating more.");
  }
  void release_slot(int slot) {
    std::lock_guard<std::mutex> lock(mutex_);
    peaks_[slot].store(-1);
  }

  static CountingAllocator& instance();

 private:
  static void free_block(void* data) {
    if (data == nullptr) return;
    void* base = static_cast<char*>(data) - kHeaderBytes;
    auto& self = instance();
    self.record(-static_cast<int64_t>(*static_cast<size_t*>(base)));
    self.inner_->raw_deallocate(base);
  }

  void record(int64_t delta) const {
    const int64_t now = current_.fetch_add(delta) + delta;
    if (delta <= 0) return;
    for (auto& peak : peaks_) {
      int64_t seen = peak.load(std::memory_order_relaxed);
      while (seen >= 0 && seen < now && !peak.compare_exchange_weak(seen, now)) {
      }
    }
  }

  c10::Allocator* inner_;
  mutable std::atomic<int64_t> current_{0};
  mutable std::array<std::atomic<int64_t>, kMaxTrackers> peaks_;
  std::mutex mutex_;
};

CountingAllocator& CountingAllocator::instance() {
  // Installed once and never destroyed: tensors freed during static destruction still need it.
  static CountingAllocator* allocator = [] {
    auto* counting = new CountingAllocator(c10::GetCPUAllocator());
    c10::SetCPUAllocator(counting, /*priority=*/255);
    return counting;
  }();
  return *allocator;
}

}  // namespace

MemoryTracker::MemoryTracker(c10::Device device) : device_(device) {
  if (device_.is_cpu()) {
    slot_ = CountingAllocator::instance().claim_slot();
    return;
  }
  // An accelerator's caching allocator keeps one high-water mark per device: start it here.
  if (!device_.has_index()) device_.set_index(0);
  compat::reset_device_peak(device_);
}

MemoryTracker::~MemoryTracker() {
  if (slot_ >= 0) CountingAllocator::instance().release_slot(slot_);
}

int64_t MemoryTracker::current_bytes() const {
  if (slot_ < 0) return compat::device_memory_stats(device_).allocated_bytes;
  return CountingAllocator::instance().current();
}

int64_t MemoryTracker::peak_bytes() const {
  if (slot_ < 0) return compat::device_memory_stats(device_).peak_allocated_bytes;
  return CountingAllocator::instance().peak(slot_);
}

void MemoryTracker::reset_peak() {
  if (slot_ < 0) {
    compat::reset_device_peak(device_);
    return;
  }
  CountingAllocator::instance().reset_peak(slot_);
}

bool MemoryTracker::can_measure(c10::Device device) {
  return device.is_cpu() || compat::device_memory_measurable(device.type());
}

}  // namespace ckpt
