#pragma once

// `ckpt train --model unet`: a U-Net (models/marked_models.h, each block a candidate) trained twice
// with the same seeds, plainly and under `ckpt::PlannedModel` at --strategy budget:B; compares
// peak memory, step time and losses.

#include "train_args.h"

#include <c10/core/Device.h>

namespace ckpt {
namespace cli {

/// Runs `ckpt train --model unet` on `device`. Returns the exit code. Throws UsageError for a
/// --strategy other than none or budget:B.
int run_train_unet(const TrainArgs& args, c10::Device device);

}  // namespace cli
}  // namespace ckpt
