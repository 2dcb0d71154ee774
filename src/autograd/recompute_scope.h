#pragma once

// What a recompute replays from its forward, in one place for regions and planned schedules.

#include "autocast_state.h"
#include "buffer_guard.h"
#include "recompute_mark.h"
#include "rng_state.h"
#include "saved_tensor_hooks.h"
#include "training_modes.h"

#include <c10/util/Optional.h>
#include <torch/nn/module.h>

#include <memory>
#include <optional>
#include <vector>

namespace ckpt {
namespace detail {

/// For its lifetime: the RNG holds the forward's stashed state (when one was stashed), autocast
/// is as it was in the forward, the modules are in the train()/eval() modes of the forward,
/// `ckpt::is_recomputing()` is true, and the buffers of `modules` are snapshotted, then hold the
/// values the forward started from where `at_forward` has them. Afterwards the RNG, autocast and
/// modes are put back and the buffers written back, also when an exception leaves the scope.
class RecomputeScope {
 public:
  RecomputeScope(const c10::optional<RngStash>& rng, const AutocastState& autocast,
                 const TrainingModes& modes,
                 const std::vector<std::shared_ptr<torch::nn::Module>>& modules,
                 const BuffersAtForward* at_forward)
      : autocast_(autocast), modes_(modes), buffers_(modules) {
    if (rng.has_value()) fork_.emplace(*rng);
    if (at_forward != nullptr) at_forward->restore();
  }
  RecomputeScope(const RecomputeScope&) = delete;
  RecomputeScope& operator=(const RecomputeScope&) = delete;

  /// After the recompute ran: `RngFork::check_drew_as_forward`, where a state was stashed.
  void check_random_draws(const std::optional<RandomDraws>& forward_draws,
                          const std::optional<RandomDraws>& recompute_draws, const char* who,
                          const char* skip_hint = "") const {
    if (fork_.has_value()) {
      fork_->check_drew_as_forward(forward_draws, recompute_draws, who, skip_hint);
    }
  }

 private:
  c10::optional<RngFork> fork_;
  AutocastScope autocast_;
  AutocastCacheOff cache_off_;
  TrainingModeScope modes_;
  RecomputeMark mark_;
  BufferGuard buffers_;
  // The recomputed graph is the backward's own: an OffloadGuard around the backward leaves it.
  SavedTensorHooksScope hooks_off_{SavedHooksFactory()};
};

}  // namespace detail
}  // namespace ckpt
