#pragma once

// Capturing the autocast state of a region's forward and re-applying it during the recompute.

#include <c10/core/ScalarType.h>

namespace ckpt {
namespace detail {

/// The autocast flags and dtypes of the CPU and CUDA, and whether the cast cache is on.
struct AutocastState {
  bool cpu_enabled = false;
  c10::ScalarType cpu_dtype = c10::ScalarType::BFloat16;
  bool cuda_enabled = false;
  c10::ScalarType cuda_dtype = c10::ScalarType::Half;
  bool cache_enabled = true;

  /// Reads the calling thread's current state.
  static AutocastState current();

  bool operator==(const AutocastState& other) const {
    return cpu_enabled == other.cpu_enabled && cpu_dtype == other.cpu_dtype &&
           cuda_enabled == other.cuda_enabled && cuda_dtype == other.cuda_dtype &&
           cache_enabled == other.cache_enabled;
  }
};

/// Applies a captured state for its lifetime and restores the previous one afterwards, with the
/// nesting and cache handling of Python's `torch.autocast` context manager. When the captured state
/// is already the current one (the usual case) it does nothing.
class AutocastScope {
 public:
  explicit AutocastScope(const AutocastState& state);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  AutocastState previous_;
  bool active_;
};

}  // namespace detail
}  // namespace ckpt
