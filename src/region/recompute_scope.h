#pragma once

// What a recompute replays from its forward, in one place for regions and planned schedules.

#include <ckpt/detail/region.h>

#include "autocast_state.h"
#include "buffer_guard.h"
#include "recompute_mark.h"
#include "rng_state.h"

#include <c10/util/Optional.h>

namespace ckpt {
namespace detail {

/// For its lifetime: the RNG holds the forward's stashed state (when one was stashed), autocast
/// is as it was in the forward (its cast cache off, as in a region's forward),
/// `ckpt::is_recomputing()` is true, and the buffers of `modules`
/// are snapshotted. Afterwards the RNG and autocast are put back and the buffers written back,
/// also when an exception leaves the scope.
class RecomputeScope {
 public:
  RecomputeScope(const c10::optional<RngStash>& rng, const AutocastState& autocast,
                 const ModuleList& modules)
      : autocast_(autocast), buffers_(modules, /*active=*/true) {
    if (rng.has_value()) fork_.emplace(*rng);
  }
  RecomputeScope(const RecomputeScope&) = delete;
  RecomputeScope& operator=(const RecomputeScope&) = delete;

 private:
  c10::optional<RngFork> fork_;
  AutocastScope autocast_;
  CastCacheOff cast_cache_off_;  // after autocast_, which sets the forward's cache flag
  RecomputeMark mark_;
  BufferGuard buffers_;
};

}  // namespace detail
}  // namespace ckpt
