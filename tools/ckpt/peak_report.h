#pragma once

// `ckpt train --trace`: what is live at each run's peak (ckpt::MemoryTracker::peak_breakdown),
// in the summary, the --json document and the trace.

#include <ckpt/memory_tracker.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

namespace ckpt {
namespace cli {

/// The breakdown of one step's peak.
struct StepPeak {
  MemoryBreakdown breakdown;
  int step = 0;            // from 1
  int64_t base_bytes = 0;  // live when the step began
};

/// The bytes that checkpointing can lower: those allocated in the forward pass ("forward" and
/// below: stages, regions and their recomputes) or by a stage recomputed in the backward pass
/// ("backward/<stage>", as PlannedSequential runs it).
int64_t activation_bytes(const MemoryBreakdown& breakdown);

/// {"step", "peak_bytes", "above_step_start_bytes", "where", "parameters_bytes",
/// "gradients_bytes", "optimizer_state_bytes", "activations_bytes", "labels": [{"label",
/// "bytes"}], "other_bytes"}.
nlohmann::json peak_json(const StepPeak& peak);

/// Prints the breakdown of run `label`'s peak: a few lines under the summary table.
void print_peak(const std::string& label, const StepPeak& peak);

}  // namespace cli
}  // namespace ckpt
