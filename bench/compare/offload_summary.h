#pragma once

// Offloading against checkpointing on one model, from the comparison's rows: the table and the
// targets of issue 50 that scripts/gpu-check.sh's "Offloading on CUDA" section prints.

#include "harness.h"

#include <string>
#include <vector>

namespace ckpt {
namespace bench {

struct OffloadSummary {
  std::string markdown;  // per model: the rows compared, then each target beside its measure
  std::vector<std::string> missing;  // rows that should have been measured and were not
};

/// For each model of `rows`, with L stages: no checkpointing, full recompute (checkpoint_sequential
/// with L segments), ckpt's offload (L offloaded segments), and where Python ran on the device,
/// its plain step, save_on_cpu(pin_memory=True) per segment and full recompute. Step times are
/// medians; ratios are against the same language's plain step. The targets: ckpt's offload at
/// most 2% above full recompute's peak, its step at most 1.05x the plain step, and no slower than
/// Python's save_on_cpu. A missed target is reported, not an error; a row that failed or is
/// absent (Python's only where `options` ran Python on CUDA) is listed in `missing`.
OffloadSummary offload_summary(const std::vector<BenchRow>& rows, const BenchOptions& options);

}  // namespace bench
}  // namespace ckpt
