#pragma once

// The storage modes of a chain's stages: every way a stage can store what its backward needs,
// in one table that the profiler, the planner's chain, the executor, the CLI and the tests read.

#include <ckpt/options.h>
#include <ckpt/selective.h>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/nn/modules/container/any.h>

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ckpt {

/// The name of the standard table's checkpointed mode, which the planners also run candidates
/// whose outputs are recomputed in.
inline constexpr const char* kCheckpointedMode = "checkpointed";

/// What storage modes read from the options of `profile_chain` (`ProfileOptions`) and of
/// `PlannedSequential` (`PlannedSequentialOptions`).
struct StorageSettings {
  /// The policy of the "selective" mode. An empty policy turns the mode off.
  SelectivePolicy selective_policy;
};

/// One way a stage of a chain can store what its backward needs, beside the plain forward that
/// keeps everything (the planner's storage option 0) and the schedule's own choices (keeping
/// only the stage's input, or nothing, and running the stage again later). A stage in a mode
/// runs as a checkpointed region with the mode's options: the profiler measures it that way, the
/// planner sees it as one of the stage's storage options (`plan::StorageOption::name` is the
/// mode's name), and `PlannedSequential` runs it that way.
struct StorageMode {
  /// How profiles, plans, `ckpt plan`'s JSON and the command line spell the mode.
  std::string name;
  /// One line for people: what a stage keeps in this mode.
  std::string summary;
  /// The options of the region the stage runs as, under `settings`; std::nullopt where the
  /// settings turn the mode off (the profiler then does not offer it).
  std::function<std::optional<CheckpointOptions>(const StorageSettings& settings)> region;

  /// The options of the region for a stage on `device`: `region(settings)`, and std::nullopt
  /// also where the mode offloads and `device` has no memory of its own to offload from (the
  /// CPU; meta tensors have no data to copy). What both profilers offer.
  std::optional<CheckpointOptions> region_on(const StorageSettings& settings,
                                             c10::Device device) const;
};

/// The storage modes a chain may use, in the order the profiler offers them. Adding a mode is
/// one `add` (see tests/chains/storage_mode_test.cpp, which adds one and plans with it).
///
/// Example:
/// ```
/// auto modes = ckpt::StorageModes::standard().remove("selective");
/// ckpt::PlannedSequential planned(model, ckpt::Budget::parse("40%"),
///                                 ckpt::PlannedSequentialOptions().storage_modes(modes));
/// ```
class StorageModes {
 public:
  /// No mode: stages keep everything, or what the schedule keeps of the chain's activations.
  StorageModes() = default;
  /// ckpt's modes: "checkpointed" (a checkpointed region: keeps the stage's output, recomputes
  /// the rest in its backward), "two_pass" (the same, its recompute in two passes,
  /// `CheckpointOptions::two_pass_recompute`: its backward holds less), "selective" (a region
  /// under the selective policy: keeps the
  /// output and what the policy saves, recomputes the rest) and "offloaded" (an offloaded region,
  /// `CheckpointOptions().offload(true)`: keeps the output, and what the backward needs in host
  /// memory; offered by the profiler on accelerators only).
  static StorageModes standard();
  /// What the profilers and planners use unless told otherwise: the standard modes but
  /// "two_pass", whose recompute stops the stage's function midway by an exception thrown through
  /// it (docs/limits.md, "A region's backward"): opt in with `standard()` where the functions are
  /// yours to vouch for (the `ckpt` command's models are).
  static StorageModes defaults();

  /// Adds `mode` at the end. An empty name, a name with characters other than letters, digits
  /// and '_', a name already present or a mode without `region` is an error (c10::Error).
  StorageModes& add(StorageMode mode);
  /// Removes the mode named `name`; an error naming the known ones when there is none.
  StorageModes& remove(const std::string& name);
  /// The mode named `name`, or nullptr.
  const StorageMode* find(const std::string& name) const;
  /// The mode named `name`; an error naming the known ones when there is none. `context` starts
  /// the message (e.g. "ckpt::PlannedSequential").
  const StorageMode& at(const std::string& name, const std::string& context) const;
  /// Every mode, in order (by value from a temporary table, so that
  /// `for (auto& mode : StorageModes::standard().all())` is safe).
  const std::vector<StorageMode>& all() const& { return modes_; }
  std::vector<StorageMode> all() && { return std::move(modes_); }
  /// The names, comma-separated ("checkpointed, selective"), or "none".
  std::string names() const;
  /// The modes named in `list` ("checkpointed,selective"; "none" or "" for none), in that
  /// order, taken from this table; an error (std::invalid_argument) names an unknown one.
  StorageModes select(const std::string& list) const;

 private:
  std::vector<StorageMode> modes_;
};

/// A stage's forward in a storage mode: `stage` run as a checkpointed region with `region`'s
/// options, in which a recompute leaves the stage's buffers (BatchNorm statistics) as the forward
/// left them; the plain forward without `region`.
std::function<at::Tensor(const at::Tensor&)> stage_forward(
    torch::nn::AnyModule stage, const std::optional<CheckpointOptions>& region = std::nullopt);

}  // namespace ckpt
