#include "allocator.h"

#include "devices.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace ckpt {
namespace emulated_device {
namespace detail {
namespace {

// CUDA's caching allocator hands out multiples of 512 bytes; counting the same way keeps the
// statistics of a run on the emulated device close to those of the run on a GPU.
constexpr size_t kRounding = 512;

void increase(compat::AllocatorStat& stat, int64_t amount) {
  stat.current += amount;
  stat.peak = std::max(stat.peak, stat.current);
  stat.allocated += amount;
}

void decrease(compat::AllocatorStat& stat, int64_t amount) {
  stat.current -= amount;
  stat.freed += amount;
}

}  // namespace

DeviceMemory& DeviceMemory::instance() {
  static auto* memory = new DeviceMemory();  // kept for the process: c10 keeps a pointer to it
  return *memory;
}

c10::DataPtr DeviceMemory::allocate_bytes(size_t bytes) const {
  return allocate_on(current(), bytes);
}

c10::DataPtr DeviceMemory::allocate_on(c10::DeviceIndex device, size_t bytes) const {
  check_index(device);
  mark_used(device);
  if (bytes == 0) return {nullptr, device_of_index(device)};
  const size_t rounded = (bytes + kRounding - 1) / kRounding * kRounding;
  std::lock_guard<std::mutex> lock(mutex_);
  auto& stats = stats_[static_cast<size_t>(device)];
  // Worded as CUDA's caching allocator words it, so that code matching its message works here.
  TORCH_CHECK_WITH(OutOfMemoryError,
                   limit_ <= 0 || stats.bytes.current + static_cast<int64_t>(rounded) <= limit_,
                   "ckpt::emulated_device: out of memory. Tried to allocate ", rounded,
                   " bytes on ", device_of_index(device), " with ", stats.bytes.current,
                   " bytes allocated of a limit of ", limit_,
                   " bytes (ckpt::emulated_device::set_memory_limit).");
  void* data = std::aligned_alloc(kRounding, rounded);
  TORCH_CHECK_WITH(OutOfMemoryError, data != nullptr,
                   "ckpt::emulated_device: out of memory allocating ", rounded, " bytes on ",
                   device_of_index(device), " (host memory).");
  blocks_.emplace(data, Block{device, rounded});
  increase(stats.bytes, static_cast<int64_t>(rounded));
  increase(stats.blocks, 1);
  return {data, data, &free_block, device_of_index(device)};
}

void DeviceMemory::free_block(void* data) {
  if (data == nullptr) return;
  DeviceMemory& self = instance();
  {
    std::lock_guard<std::mutex> lock(self.mutex_);
    const auto found = self.blocks_.find(data);
    TORCH_INTERNAL_ASSERT(found != self.blocks_.end(), "emulated device: freeing unknown memory");
    auto& stats = self.stats_[static_cast<size_t>(found->second.device)];
    decrease(stats.bytes, static_cast<int64_t>(found->second.bytes));
    decrease(stats.blocks, 1);
    self.blocks_.erase(found);
  }
  std::free(data);
}

c10::Device DeviceMemory::device_of(const void* data) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto found = blocks_.find(data);
  TORCH_CHECK(found != blocks_.end(), "ckpt::emulated_device: ", data,
              " is not the start of a block of the emulated device's memory.");
  return device_of_index(found->second.device);
}

void DeviceMemory::resize(const c10::Storage& storage, size_t bytes) const {
  c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
  TORCH_CHECK(impl->resizable(), "Trying to resize storage that is not resizable");
  c10::DataPtr data = allocate_on(impl->device().index(), bytes);
  const size_t kept = std::min(bytes, impl->nbytes());
  if (kept > 0) std::memcpy(data.get(), impl->data_ptr().get(), kept);
  impl->set_data_ptr_noswap(std::move(data));
  impl->set_nbytes(bytes);
}

compat::AllocatorStats DeviceMemory::stats(c10::DeviceIndex device) const {
  check_index(device);
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_[static_cast<size_t>(device)];
}

void DeviceMemory::reset_peak(c10::DeviceIndex device) const {
  check_index(device);
  std::lock_guard<std::mutex> lock(mutex_);
  auto& stats = stats_[static_cast<size_t>(device)];
  stats.bytes.peak = stats.bytes.current;
  stats.blocks.peak = stats.blocks.current;
}

void DeviceMemory::reset_accumulated(c10::DeviceIndex device) const {
  check_index(device);
  std::lock_guard<std::mutex> lock(mutex_);
  auto& stats = stats_[static_cast<size_t>(device)];
  stats.bytes.allocated = stats.bytes.freed = 0;
  stats.blocks.allocated = stats.blocks.freed = 0;
}

void DeviceMemory::set_limit(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  limit_ = std::max<int64_t>(bytes, 0);
}

}  // namespace detail
}  // namespace emulated_device
}  // namespace ckpt
