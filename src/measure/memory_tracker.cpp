#include <ckpt/memory_tracker.h>

#include <ckpt/memory_label.h>

#include "compat/torch_compat.h"
#include "measure/free_watch.h"
#include "measure/meta_memory.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/macros/Macros.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <new>
#include <numeric>
#include <unordered_set>

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
  uint64_t sequence;       // its number among the allocations recorded; 0: none recorded it
  int label;               // its label's number (detail::current_label_id) if recorded, else -1
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

// What was live at a recording tracker's peak: the bytes under each label, and the number of the
// allocation that reached it (the blocks live now with a number up to it were live there).
struct PeakRecord {
  bool active = false;
  int64_t bytes = 0;
  uint64_t sequence = 0;
  int label = -1;
  std::chrono::steady_clock::time_point time;
  std::vector<int64_t> label_bytes;
};

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
    auto* header = new (base) BlockHeader{bytes, counter, 0, -1};
    void* data = static_cast<char*>(base) + kHeaderBytes;
    if (recorders_.load(std::memory_order_relaxed) > 0) {
      record_labelled(*header);
    } else {
      record(static_cast<int64_t>(bytes), counter);
    }
    return {data, data, &CountingAllocator::free_block, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &CountingAllocator::free_block; }

  int64_t current(const ThreadCounter* counter) const {
    return counter != nullptr ? counter->current.load() : current_.load();
  }
  int64_t peak(int slot) const { return peaks_[slot].load(); }
  void reset_peak(int slot) {
    if (recorders_.load() > 0) {
      std::lock_guard<std::mutex> lock(record_mutex_);
      if (records_[slot].active) {
        restart_peak(slot);
        return;
      }
    }
    peaks_[slot].store(current(owners_[slot].load()));
  }

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

  // Recording what is live at `slot`'s peaks, from the current point on.
  void start_recording(int slot) {
    std::lock_guard<std::mutex> lock(record_mutex_);
    records_[slot].active = true;
    restart_peak(slot);
    recorders_.fetch_add(1);
  }
  void stop_recording(int slot) {
    std::lock_guard<std::mutex> lock(record_mutex_);
    if (!records_[slot].active) return;
    records_[slot] = PeakRecord();
    recorders_.fetch_sub(1);
  }
  PeakRecord peak_record(int slot) const {
    std::lock_guard<std::mutex> lock(record_mutex_);
    return records_[slot];
  }

  // The header of a live block of this allocator's, or null for another allocator's data.
  static const BlockHeader* header_of(const c10::DataPtr& data) {
    if (data.get_deleter() != &CountingAllocator::free_block || data.get() == nullptr) {
      return nullptr;
    }
    return static_cast<const BlockHeader*>(
        static_cast<const void*>(static_cast<const char*>(data.get()) - kHeaderBytes));
  }

  static CountingAllocator& instance();

  void add_free_watch(const std::function<void(const void*)>* on_free) {
    const std::lock_guard<std::mutex> lock(watch_mutex_);
    free_watches_.push_back(on_free);
    watching_frees_.fetch_add(1);
  }
  void remove_free_watch(const std::function<void(const void*)>* on_free) {
    const std::lock_guard<std::mutex> lock(watch_mutex_);
    free_watches_.erase(std::find(free_watches_.begin(), free_watches_.end(), on_free));
    watching_frees_.fetch_sub(1);
  }

 private:
  C10_NOINLINE void notify_free(const void* data) {
    const std::lock_guard<std::mutex> lock(watch_mutex_);
    for (const auto* on_free : free_watches_) (*on_free)(data);
  }

  static void free_block(void* data) {
    if (data == nullptr) return;
    void* base = static_cast<char*>(data) - kHeaderBytes;
    const BlockHeader header = *static_cast<BlockHeader*>(base);
    auto& self = instance();
    if (header.label >= 0) {
      self.free_labelled(header);
    } else {
      self.current_.fetch_sub(static_cast<int64_t>(header.bytes));
    }
    if (header.counter != nullptr) {
      header.counter->current.fetch_sub(static_cast<int64_t>(header.bytes));
      header.counter->release();
    }
    if (self.watching_frees_.load(std::memory_order_relaxed) > 0) self.notify_free(data);
    self.inner_->raw_deallocate(base);
  }

  // Returns the process's live bytes after the allocation.
  int64_t record(int64_t bytes, ThreadCounter* counter) const {
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
    return process;
  }

  // The allocation path while a tracker records: under one lock, so that the counts by label
  // and the process's count at each recorded peak agree exactly. Out of line, as free_labelled:
  // the default path stays small enough to inline.
  C10_NOINLINE void record_labelled(BlockHeader& header) const {
    const int label = detail::current_label_id();
    const auto bytes = static_cast<int64_t>(header.bytes);
    std::lock_guard<std::mutex> lock(record_mutex_);
    header.sequence = ++sequence_;
    header.label = label;
    if (label >= 0) {
      if (label_bytes_.size() <= static_cast<size_t>(label)) label_bytes_.resize(label + 1, 0);
      label_bytes_[static_cast<size_t>(label)] += bytes;
    }
    const int64_t now = record(bytes, header.counter);
    for (int slot = 0; slot < kMaxTrackers; ++slot) {
      PeakRecord& peak = records_[slot];
      if (peak.active && now > peak.bytes) snapshot(peak, now, header.sequence, label);
    }
  }

  C10_NOINLINE void free_labelled(const BlockHeader& header) {
    const auto bytes = static_cast<int64_t>(header.bytes);
    std::lock_guard<std::mutex> lock(record_mutex_);
    label_bytes_[static_cast<size_t>(header.label)] -= bytes;
    current_.fetch_sub(bytes);
  }

  // A new high-water mark for a recording slot at the current point (under record_mutex_).
  void restart_peak(int slot) {
    const int64_t now = current_.load();
    peaks_[slot].store(now);
    snapshot(records_[slot], now, sequence_, -1);
  }

  void snapshot(PeakRecord& peak, int64_t bytes, uint64_t sequence, int label) const {
    peak.bytes = bytes;
    peak.sequence = sequence;
    peak.label = label;
    peak.time = std::chrono::steady_clock::now();
    peak.label_bytes.assign(label_bytes_.begin(), label_bytes_.end());
  }

  c10::Allocator* inner_;
  mutable std::atomic<int64_t> current_{0};
  mutable std::array<std::atomic<int64_t>, kMaxTrackers> peaks_;
  std::array<std::atomic<ThreadCounter*>, kMaxTrackers> owners_;
  std::mutex mutex_;
  // Recording (record_breakdown): how many trackers record, and under record_mutex_, the
  // allocations' count, the live bytes under each label, and each slot's peak record.
  std::atomic<int> recorders_{0};
  mutable std::mutex record_mutex_;
  mutable uint64_t sequence_ = 0;
  mutable std::vector<int64_t> label_bytes_;
  mutable std::array<PeakRecord, kMaxTrackers> records_;
  // detail::FreeWatch: how many watch, and under watch_mutex_, what they call.
  std::atomic<int> watching_frees_{0};
  std::mutex watch_mutex_;
  std::vector<const std::function<void(const void*)>*> free_watches_;
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

detail::FreeWatch::FreeWatch(std::function<void(const void* data)> on_free)
    : on_free_(std::move(on_free)) {
  CountingAllocator::instance().add_free_watch(&on_free_);
}

detail::FreeWatch::~FreeWatch() {
  CountingAllocator::instance().remove_free_watch(&on_free_);
}

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
  if (device_.is_meta()) {  // a modeled device (<ckpt/modeled_device.h>)
    TORCH_CHECK(detail::modeling_on_this_thread(), "ckpt::MemoryTracker: the memory of ", device_,
                " can't be measured on its own: meta tensors have shapes, no memory. Measure "
                "them under a ckpt::ModeledDevice (<ckpt/modeled_device.h>), which counts them "
                "as a device you choose would.");
    detail::reset_meta_peak();
    return;
  }
  // An accelerator's caching allocator keeps one high-water mark per device: start it here.
  if (!device_.has_index()) device_.set_index(0);
  compat::reset_device_peak(device_);
}

MemoryTracker::~MemoryTracker() {
  if (recording_) CountingAllocator::instance().stop_recording(slot_);
  if (slot_ >= 0) CountingAllocator::instance().release_slot(slot_);
  if (thread_ != nullptr) {
    thread_->trackers.fetch_sub(1);
    thread_->release();
  }
}

int64_t MemoryTracker::current_bytes() const {
  if (device_.is_meta()) return detail::meta_allocated_bytes();
  if (slot_ < 0) return compat::device_memory_stats(device_).allocated_bytes;
  return CountingAllocator::instance().current(thread_);
}

int64_t MemoryTracker::peak_bytes() const {
  if (device_.is_meta()) return detail::meta_peak_bytes();
  if (slot_ < 0) return compat::device_memory_stats(device_).peak_allocated_bytes;
  return CountingAllocator::instance().peak(slot_);
}

void MemoryTracker::reset_peak() {
  if (device_.is_meta()) {
    detail::reset_meta_peak();
    return;
  }
  if (slot_ < 0) {
    compat::reset_device_peak(device_);
    return;
  }
  CountingAllocator::instance().reset_peak(slot_);
}

void MemoryTracker::record_breakdown() {
  TORCH_CHECK(slot_ >= 0,
              "ckpt::MemoryTracker::record_breakdown: a breakdown of the peak needs the blocks of "
              "the CPU counting allocator, but this tracker measures ",
              device_,
              ", whose caching allocator keeps statistics, not blocks, so it can't tell what was "
              "live at the peak. Run the step on the CPU to see its breakdown.");
  TORCH_CHECK(
      thread_ == nullptr,
      "ckpt::MemoryTracker::record_breakdown: a breakdown covers every thread's blocks, but "
      "this tracker counts MemoryScope::CallingThread. Use a MemoryScope::Process tracker.");
  if (recording_) return;
  CountingAllocator::instance().start_recording(slot_);
  recording_ = true;
}

namespace {

// Moves the bytes of the tensors' blocks that were live at `peak` out of the bytes by label (or
// out of `other`) into `into`, once per block.
void classify(const std::vector<at::Tensor>& tensors, const PeakRecord& peak,
              std::unordered_set<const void*>& seen, std::vector<int64_t>& label_bytes,
              int64_t& other, int64_t& into) {
  for (const at::Tensor& tensor : tensors) {
    if (!tensor.defined() || !tensor.has_storage() || !tensor.device().is_cpu()) continue;
    const c10::DataPtr& data = tensor.storage().data_ptr();
    const BlockHeader* header = CountingAllocator::header_of(data);
    // Not counted (another allocator's, or from before the tracker's), or allocated after the peak.
    if (header == nullptr || header->sequence > peak.sequence) continue;
    if (!seen.insert(data.get()).second) continue;
    const auto bytes = static_cast<int64_t>(header->bytes);
    into += bytes;
    const auto label = static_cast<size_t>(header->label);
    if (header->label >= 0 && label < label_bytes.size()) {
      label_bytes[label] -= bytes;
    } else {
      other -= bytes;
    }
  }
}

std::vector<at::Tensor> gradients_of(const std::vector<at::Tensor>& parameters) {
  std::vector<at::Tensor> gradients;
  for (const at::Tensor& parameter : parameters) {
    if (parameter.defined()) gradients.push_back(parameter.grad());
  }
  return gradients;
}

}  // namespace

MemoryBreakdown MemoryTracker::peak_breakdown(
    const std::vector<at::Tensor>& parameters,
    const std::vector<at::Tensor>& optimizer_state) const {
  TORCH_CHECK(recording_,
              "ckpt::MemoryTracker::peak_breakdown: this tracker keeps no record of its peak; call "
              "record_breakdown() before the step whose peak you want to see.");
  const PeakRecord peak = CountingAllocator::instance().peak_record(slot_);
  std::vector<int64_t> label_bytes = peak.label_bytes;
  MemoryBreakdown breakdown;
  breakdown.peak_bytes = peak.bytes;
  breakdown.where = detail::label_text(peak.label);
  breakdown.time = peak.time;
  breakdown.other_bytes =
      peak.bytes - std::accumulate(label_bytes.begin(), label_bytes.end(), int64_t{0});
  std::unordered_set<const void*> seen;
  classify(parameters, peak, seen, label_bytes, breakdown.other_bytes, breakdown.parameters_bytes);
  classify(gradients_of(parameters), peak, seen, label_bytes, breakdown.other_bytes,
           breakdown.gradients_bytes);
  classify(optimizer_state, peak, seen, label_bytes, breakdown.other_bytes,
           breakdown.optimizer_state_bytes);
  for (size_t label = 0; label < label_bytes.size(); ++label) {
    if (label_bytes[label] != 0) {
      breakdown.labels.emplace_back(detail::label_text(static_cast<int>(label)),
                                    label_bytes[label]);
    }
  }
  std::stable_sort(breakdown.labels.begin(), breakdown.labels.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  return breakdown;
}

std::ostream& operator<<(std::ostream& out, const MemoryBreakdown& breakdown) {
  out << "peak " << breakdown.peak_bytes << " B";
  if (!breakdown.where.empty()) out << " at " << breakdown.where;
  out << ": parameters " << breakdown.parameters_bytes << " B, gradients "
      << breakdown.gradients_bytes << " B, optimizer state " << breakdown.optimizer_state_bytes
      << " B";
  for (const auto& [label, bytes] : breakdown.labels) out << ", " << label << " " << bytes << " B";
  return out << ", other " << breakdown.other_bytes << " B";
}

bool MemoryTracker::can_measure(c10::Device device) {
  return device.is_cpu() || (device.is_meta() && detail::modeling_on_this_thread()) ||
         compat::device_memory_measurable(device.type());
}

}  // namespace ckpt
