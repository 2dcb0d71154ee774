#pragma once

// A schedule in rotor's operation language: forward_none / forward_input / forward_all /
// loss / backward over the stages of a `Chain`.

#include <string>
#include <utility>
#include <vector>

namespace ckpt {
namespace plan {

/// The kind of one operation of a schedule.
enum class OpKind {
  /// No-grad forward of stage i (rotor F∅, "Fn"): frees x_i afterwards unless x_i is a
  /// checkpoint.
  ForwardNone,
  /// No-grad forward of stage i that keeps its input x_i as a checkpoint (rotor Fck).
  ForwardInput,
  /// Grad-enabled forward of stage i that keeps x̄_{i+1} for the backward (rotor Fall).
  ForwardAll,
  /// Backward of stage i: consumes δ_{i+1} and x̄_{i+1}, produces δ_i.
  Backward,
  /// The loss: consumes x_L, produces δ_L. Its stage index is L (the number of stages).
  Loss,
};

/// The JSON spelling: "forward_none", "forward_input", "forward_all", "backward", "loss".
const char* to_string(OpKind kind);

/// Inverse of `to_string(OpKind)`. Throws std::invalid_argument for any other string.
OpKind parse_op_kind(const std::string& name);

/// One operation: a kind, a stage index, and for `ForwardAll`/`Backward` the storage option.
struct Op {
  OpKind kind = OpKind::ForwardNone;
  /// Stage index in [0, L); L for `Loss`.
  int stage = 0;
  /// Full-storage option (see `Stage::alternatives`); a `Backward` carries the option of the
  /// `ForwardAll` whose x̄ it consumes. Must be 0 for the other kinds. Default: 0
  int option = 0;

  bool operator==(const Op& other) const {
    return kind == other.kind && stage == other.stage && option == other.option;
  }
  bool operator!=(const Op& other) const { return !(*this == other); }
};

/// A sequence of operations that runs one training step (forward, loss, backward) of a chain.
struct Schedule {
  Schedule() = default;
  Schedule(std::vector<Op> ops_, std::vector<int> look_ahead_ = {})  // NOLINT: {ops} reads well
      : ops(std::move(ops_)), look_ahead(std::move(look_ahead_)) {}

  std::vector<Op> ops;
  /// Look-ahead: stages i whose offloaded data (an offload option's `ForwardAll`) starts coming
  /// back when the backward of stage i + 1 starts, which must come right before `B`i, instead of
  /// when `B`i starts. The copies then run during that backward, which holds the data as well
  /// (docs/memory-model.md, "Offloading"). Increasing. Default: none
  std::vector<int> look_ahead;

  bool operator==(const Schedule& other) const {
    return ops == other.ops && look_ahead == other.look_ahead;
  }
  bool operator!=(const Schedule& other) const { return !(*this == other); }
};

/// Short notation of one operation: `Fn3` (forward_none of stage 3), `Fck3` (forward_input),
/// `Fall3` (forward_all, option 0), `Fall3.1` (option 1), `L` (loss), `B3`, `B3.1` (backward).
std::string to_string(const Op& op);

/// The operations in short notation (see `to_string(const Op&)`), separated by single spaces,
/// e.g. `Fck0 Fn1 Fall2 L B2 Fall0 Fall1 B1 B0`; a look-ahead follows as `ahead: 2 5`.
std::string to_string(const Schedule& schedule);

/// Number of forward operations (forward_none, forward_input and forward_all) in the schedule.
int forward_count(const Schedule& schedule);

}  // namespace plan
}  // namespace ckpt
