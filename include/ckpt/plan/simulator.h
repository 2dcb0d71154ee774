#pragma once

// Predicts the time and peak memory of a schedule, and rejects invalid schedules.
// The rules are written out in docs/memory-model.md.

#include <cstdint>
#include <string>

#include "ckpt/plan/chain.h"
#include "ckpt/plan/schedule.h"

namespace ckpt {
namespace plan {

/// What `simulate` predicts for one schedule.
struct SimulationResult {
  /// False when the schedule breaks a rule; `error` then says which op and why, and the
  /// numbers below describe the prefix that ran.
  bool valid = false;
  /// Empty when valid; otherwise e.g. "op 3 (B1): δ_2 is not in memory ...".
  std::string error;
  /// Index of the offending op, or -1 (valid, or a problem found at the end of the schedule).
  int error_op_index = -1;
  /// Sum of the times of the ops.
  double time = 0.0;
  /// Peak bytes over the step, x_0 included (see docs/memory-model.md for the exact rule).
  int64_t peak_bytes = 0;
  /// Index of the first op that reaches `peak_bytes`, or -1 if the peak is x_0 alone.
  int peak_op_index = -1;
  /// Peak bytes in host memory: each forward_all of an offload option adds its offloaded_bytes
  /// (counted at that op), its backward releases them at its end. 0 without offloading.
  int64_t host_peak_bytes = 0;
  /// Number of forward ops (forward_none, forward_input, forward_all).
  int forward_count = 0;
  /// Bytes held after the last op (x_0, δ_0 and the stages' gradient_bytes for a complete
  /// persistent schedule).
  int64_t final_bytes = 0;
};

/// Runs `schedule` on `chain` under the memory model of docs/memory-model.md.
///
/// Throws std::invalid_argument if `chain` is invalid (see `Chain::validate`); an invalid
/// schedule is not an exception: the result has `valid == false` and an `error`.
SimulationResult simulate(const Chain& chain, const Schedule& schedule);

/// `schedule` with the look-ahead (`Schedule::look_ahead`) of offloaded stages whose backward
/// comes right after the next stage's, each taken, first stage last, where holding its data
/// during that backward keeps the simulated peak within `budget_bytes` (or within the schedule's
/// own peak, if that is larger): the copies back hide behind compute in memory the budget
/// allows. Replaces the schedule's look-ahead; an invalid schedule comes back as it was.
Schedule add_look_ahead(const Chain& chain, Schedule schedule, int64_t budget_bytes);

}  // namespace plan
}  // namespace ckpt
