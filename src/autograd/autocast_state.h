#pragma once

// Capturing the autocast state of a region's forward and re-applying it during the recompute.

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

namespace ckpt {
namespace detail {

/// Whether autocast is on for one device type, and to which dtype it casts.
struct DeviceAutocast {
  c10::DeviceType type = c10::DeviceType::CPU;
  bool enabled = false;
  c10::ScalarType dtype = c10::ScalarType::BFloat16;

  bool operator==(const DeviceAutocast& other) const {
    return type == other.type && enabled == other.enabled && dtype == other.dtype;
  }
};

/// The autocast state a region's forward ran under, as Python's checkpoint keeps it: the CPU's,
/// that of the region's device type (CUDA, XPU, MPS, ... whichever its arguments use, when
/// autocast knows that type in this LibTorch), and whether the cast cache is on.
struct AutocastState {
  DeviceAutocast cpu;
  bool has_device = false;
  DeviceAutocast device;
  bool cache_enabled = true;

  /// Reads the calling thread's current state for the CPU and `device_type`.
  static AutocastState current(c10::DeviceType device_type);

  bool operator==(const AutocastState& other) const {
    return cpu == other.cpu && has_device == other.has_device &&
           (!has_device || device == other.device) && cache_enabled == other.cache_enabled;
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

/// Turns autocast's cast cache off for its lifetime, and back to what it was afterwards. A region's
/// forward and its recompute run with it off: a cast that the cache held from before the region
/// would give the forward a gradient edge into that cast, which a recompute after the autocast
/// context ended (and its cache with it) could not reproduce; with it off, both passes cast inside
/// the region, into the same edges. A weight used twice in a region under autocast is cast twice.
class AutocastCacheOff {
 public:
  AutocastCacheOff();
  ~AutocastCacheOff();
  AutocastCacheOff(const AutocastCacheOff&) = delete;
  AutocastCacheOff& operator=(const AutocastCacheOff&) = delete;

 private:
  bool previous_;
};

}  // namespace detail
}  // namespace ckpt
