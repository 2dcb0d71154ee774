#pragma once

// `ckpt plan --model`: a bench model measured on the meta device under a device profile.

#include "plan_command.h"

namespace ckpt {
namespace cli {

ModeledChain modeled_bench_chain(const PlanArgs& args);

}  // namespace cli
}  // namespace ckpt
