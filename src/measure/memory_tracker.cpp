#include <ckpt/memory_tracker.h>

#include "compat/torch_compat.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <array>
#include <atomic>
#include <mutex>
#include <new>

namespace ckpt {
namespace detail {

// The live bytes allocated by one thread while trackers of MemoryScope::CallingThread count it.
// Blocks point at it and may be freed on other threads after it stopped counting, so it lives
// while anything refers to it: the thread, its trackers, its live blocks.
struct ThreadCounter {
  std::atomic<int64_t> current{0};
  std::atomic<int64_t> references{1};  // the thread's own
  std::atomic<int> trackers{0};

  void release() {
    if (references.fetch_sub(1) == 1) delete this;
  }
};

}  // namespace detail

namespace {

using detail::ThreadCounter;

constexpr int kMaxTrackers = 64;
// Each block carries its size and its thread's counter in a header; 64 bytes keep LibTorch's CPU
// alignment.
constexpr size_t kHeaderBytes = 64;

struct BlockHeader {
  size_t bytes;
  ThreadCounter* counter;  // null when no thread-scoped tracker counted its allocation
};
static_assert(sizeof(BlockHeader) <= kHeaderBytes, "the block header must fit its space");

// The calling thread's counter, while one of its trackers counts.
class ThreadSlot {
 public:
  ~ThreadSlot() { reset(); }

  ThreadCounter* counting() {
    if (counter_ != nullptr && counter_->trackers.load() == 0) reset();
    return counter_;
  }
  ThreadCounter* get_or_create() {
    if (counter_ == nullptr) counter_ = new ThreadCounter;
    return counter_;
  }

 private:
  void reset() {
    if (counter_ != nullptr) counter_->release();
    counter_ = nullptr;
  }

  ThreadCounter* counter_ = nullptr;
};

thread_local ThreadSlot t_slot;

// Forwards to the previous CPU allocator and counts live bytes, process-wide and per counting
// thread. Each live tracker owns a slot whose peak the allocator raises (owner: null for the
// process, else the thread's counter); slots are claimed and released under a mutex, the counters
// are atomic.
class CountingAllocator final : public compat::AllocatorBase {
 public:
  explicit CountingAllocator(c10::Allocator* inner) : inner_(inner) {
    for (auto& peak : peaks_) peak.store(-1);
    for (auto& owner : owners_) owner.store(nullptr);
  }

  c10::DataPtr allocate_bytes(size_t bytes) const override {
    if (bytes == 0) return inner_->allocate(0);
    void* base = inner_->raw_allocate(bytes + kHeaderBytes);
    ThreadCounter* counter = t_slot.counting();
    if (counter != nullptr) counter->references.fetch_add(1);
    new (base) BlockHeader{bytes, counter};
    void* data = static_cast<char*>(base) + kHeaderBytes;
    record(static_cast<int64_t>(bytes), counter);
    return {data, data, &CountingAllocator::free_block, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &CountingAllocator::free_block; }

  int64_t current(const ThreadCounter* counter) const {
    return counter != nullptr ? counter->current.load() : current_.load();
  }
  int64_t peak(int slot) const { return peaks_[slot].load(); }
  void reset_peak(int slot) { peaks_[slot].store(current(owners_[slot].load())); }

  int claim_slot(ThreadCounter* owner) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (int slot = 0; slot < kMaxTrackers; ++slot) {
      if (peaks_[slot].load() < 0) {
        owners_[slot].store(owner);
        peaks_[slot].store(current(owner));
        return slot;
      }
    }
    TORCH_CHECK(false, "ckpt::MemoryTracker: at most ", kMaxTrackers,
                " trackers can be alive at once; destroy some before creating more.");
  }
  void release_slot(int slot) {
    std::lock_guard<std::mutex> lock(mutex_);
    peaks_[slot].store(-1);
    owners_[slot].store(nullptr);
  }

  static CountingAllocator& instance();

 private:
  static void free_block(void* data) {
    if (data == nullptr) return;
    void* base = static_cast<char*>(data) - kHeaderBytes;
    const BlockHeader header = *static_cast<BlockHeader*>(base);
    auto& self = instance();
    self.current_.fetch_sub(static_cast<int64_t>(header.bytes));
    if (header.counter != nullptr) {
      header.counter->current.fetch_sub(static_cast<int64_t>(header.bytes));
      header.counter->release();
    }
    self.inner_->raw_deallocate(base);
  }

  void record(int64_t bytes, ThreadCounter* counter) const {
    const int64_t process = current_.fetch_add(bytes) + bytes;
    const int64_t thread = counter != nullptr ? counter->current.fetch_add(bytes) + bytes : 0;
    for (int slot = 0; slot < kMaxTrackers; ++slot) {
      const ThreadCounter* owner = owners_[slot].load();
      if (owner != nullptr && owner != counter) continue;
      const int64_t now = owner == nullptr ? process : thread;
      auto& peak = peaks_[slot];
      int64_t seen = peak.load(std::memory_order_relaxed);
      while (seen >= 0 && seen < now && !peak.compare_exchange_weak(seen, now)) {
      }
    }
  }

  c10::Allocator* inner_;
  mutable std::atomic<int64_t> current_{0};
  mutable std::array<std::atomic<int64_t>, kMaxTrackers> peaks_;
  std::array<std::atomic<ThreadCounter*>, kMaxTrackers> owners_;
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

MemoryTracker::MemoryTracker(c10::Device device, MemoryScope scope) : device_(device) {
  if (device_.is_cpu()) {
    if (scope == MemoryScope::CallingThread) {
      thread_ = t_slot.get_or_create();
      thread_->references.fetch_add(1);
      thread_->trackers.fetch_add(1);
    }
    slot_ = CountingAllocator::instance().claim_slot(thread_);
    return;
  }
  TORCH_CHECK(scope == MemoryScope::Process,
              "ckpt::MemoryTracker: MemoryScope::CallingThread counts CPU allocations only, but "
              "the device is ",
              device_,
              "; an accelerator's caching allocator keeps one count per device. Use "
              "MemoryScope::Process there.");
  // An accelerator's caching allocator keeps one high-water mark per device: start it here.
  if (!device_.has_index()) device_.set_index(0);
  compat::reset_device_peak(device_);
}

MemoryTracker::~MemoryTracker() {
  if (slot_ >= 0) CountingAllocator::instance().release_slot(slot_);
  if (thread_ != nullptr) {
    thread_->trackers.fetch_sub(1);
    thread_->release();
  }
}

int64_t MemoryTracker::current_bytes() const {
  if (slot_ < 0) return compat::device_memory_stats(device_).allocated_bytes;
  return CountingAllocator::instance().current(thread_);
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
