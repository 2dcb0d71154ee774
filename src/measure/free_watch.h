#pragma once

// Blocks of the CPU counting allocator (see <ckpt/memory_tracker.h>) watched as they are freed:
// a profiled step learns where inside a segment a storage went, and so whether it was still live
// at the segment's peak.

#include <functional>

namespace ckpt {
namespace detail {

/// While it lives, calls `on_free` with the data pointer of every block the CPU counting allocator
/// frees, on the freeing thread, after the block's bytes stopped counting. `on_free` runs under a
/// lock and must not free CPU tensors. Blocks of other devices are not seen.
class FreeWatch {
 public:
  explicit FreeWatch(std::function<void(const void* data)> on_free);
  ~FreeWatch();
  FreeWatch(const FreeWatch&) = delete;
  FreeWatch& operator=(const FreeWatch&) = delete;

 private:
  std::function<void(const void*)> on_free_;
};

}  // namespace detail
}  // namespace ckpt
