#pragma once

// What the measuring code reads of a modeled device (<ckpt/modeled_device.h>): the meta device's
// allocation count and the modeled clock.

#include <cstdint>

namespace ckpt {
namespace detail {

/// Bytes allocated on the meta device and still live, each allocation rounded as the modeled
/// device's allocator rounds it.
int64_t meta_allocated_bytes();
/// The high-water mark of `meta_allocated_bytes()` since the last `reset_meta_peak()`.
int64_t meta_peak_bytes();
void reset_meta_peak();
/// The granularity the meta device's allocations are counted in (the modeled device's; 1 without
/// one).
int64_t meta_granularity();
/// Whether a `ModeledDevice` is active on this thread.
bool modeling_on_this_thread();
/// Seconds the cost model has charged to this thread's operators on meta tensors since its
/// `ModeledDevice` started.
double modeled_seconds();
/// Operators on meta tensors that draw random numbers, counted on this thread since its
/// `ModeledDevice` started: a stage that drew some would have moved the device's generator.
int64_t modeled_random_draws();
/// The active `ModeledDevice`'s `DeviceProfile::random_state_bytes` on this thread (0 without one).
int64_t modeled_random_state_bytes();

}  // namespace detail
}  // namespace ckpt
