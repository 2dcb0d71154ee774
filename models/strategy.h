#pragma once

// The checkpointing strategies the tools run a chain under, spelled as `ckpt train --strategy`
// spells them: one parser and one mapping to a forward for the program (tools/ckpt), the
// benchmarks (bench/compare, bench/instructions) and the tests.

#include <ckpt/options.h>
#include <ckpt/plan/spec.h>
#include <ckpt/storage_mode.h>

#include <ATen/core/Tensor.h>
#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <functional>
#include <string>

namespace ckpt {
namespace models {

/// How a chain runs its forward pass.
struct Strategy {
  enum class Kind {
    None,        ///< the plain chain: "none"
    Sequential,  ///< checkpoint_sequential: "sequential:K", "sequential_reentrant:K"
    Selective,   ///< checkpoint_sequential under save_matmuls(): "selective", "selective:K"
    Budget,      ///< PlannedSequential under a budget: "budget:64MiB", "budget:40%", "budget:min"
    /// checkpoint_sequential's segments as offloaded regions (CheckpointOptions().offload(true)):
    /// "offload", "offload:K". Needs the chain on an accelerator.
    Offload,
  };
  Kind kind = Kind::None;
  int64_t segments = 0;    ///< Sequential, Selective and Offload: checkpoint_sequential's segments
  bool reentrant = false;  ///< Sequential: the reentrant variant
  plan::Budget budget = plan::Budget::minimum();  ///< Budget: the planner's budget
  /// Budget: the storage modes the planner may give a stage (`--storage-modes`).
  StorageModes storage_modes = StorageModes::standard();
  std::string text = "none";  ///< the strategy as spelled, such as "sequential:4"
  /// Offload: how the regions move their data.
  OffloadOptions offload_options;

  static Strategy sequential(int64_t segments, bool reentrant = false);
  static Strategy selective(int64_t segments);
  static Strategy offload(int64_t segments);
};

/// Parses a strategy for a chain of `stage_count` stages: none | sequential:K |
/// sequential_reentrant:K | selective | selective:K | offload | offload:K | budget:B. `selective`
/// and `offload` alone make every stage its own region. Throws std::invalid_argument, with a
/// message that starts with the
/// `--strategy` option, when `text` is none of these or K is not in [1, stage_count];
/// `stage_count_note` follows the count in that message (" = layers + 2").
Strategy parse_strategy(const std::string& text, int64_t stage_count,
                        const std::string& stage_count_note = "");

/// The storage modes named in `list` (`--storage-modes`: "checkpointed,selective", "none"), from
/// `StorageModes::standard()`. Throws std::invalid_argument, with a message that starts with the
/// option, naming the modes there are.
StorageModes parse_storage_modes(const std::string& list);

/// `--storage-modes`' help: its spelling and each mode of `StorageModes::standard()` with what it
/// keeps.
std::string storage_modes_help();

/// The options the regions of a Sequential, Selective or Offload strategy run under.
CheckpointOptions checkpoint_options(const Strategy& strategy);

using Forward = std::function<at::Tensor(const at::Tensor&)>;

/// The forward pass of `chain` under a strategy that needs no plan (None, Sequential, Selective,
/// Offload), sharing the chain. A Budget strategy runs `PlannedSequential(chain, strategy.budget)`,
/// which the caller plans and owns: throws std::invalid_argument for it.
Forward chain_forward(const Strategy& strategy, torch::nn::Sequential chain);

}  // namespace models
}  // namespace ckpt
