// The host memory of offloaded activations in the min-max programs: docs/memory-model.md,
// "Offloading".

#include <algorithm>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>

#include "ckpt/plan/solvers.h"
#include "min_memory.h"
#include "pareto.h"

namespace ckpt {
namespace plan {
namespace {

// The chain with every time 0: the Pareto program on it keeps only (device, host) points.
Chain without_times(Chain chain) {
  chain.host_bandwidth = 0;
  for (Stage& stage : chain.stages) {
    stage.forward_time = stage.backward_time = 0;
    if (stage.forward_all_time >= 0) stage.forward_all_time = 0;
    for (StorageOption& option : stage.alternatives) option.forward_time = option.backward_time = 0;
  }
  return chain;
}

}  // namespace

namespace detail {

void check_host_budget(const char* function, const OptimalOptions& options) {
  if (options.host_budget_bytes < 0) {
    throw std::invalid_argument(std::string(function) +
                                ": options.host_budget_bytes must be >= 0 bytes, but got " +
                                std::to_string(options.host_budget_bytes) +
                                ". Leave it at its default for unlimited host memory.");
  }
  if (options.host_slots < 1) {
    throw std::invalid_argument(std::string(function) +
                                ": options.host_slots must be at least 1, but got " +
                                std::to_string(options.host_slots) + ".");
  }
}

std::optional<MinMemoryPlan> min_memory_within_host(const Chain& chain,
                                                    const OptimalOptions& options) {
  const bool restricted = options.forward_all_only_before_backward;
  const int64_t host = options.host_budget_bytes;
  const ParetoProgram sizes(without_times(chain), Chain::kMaxTotalBytes, host, restricted,
                            options.max_exact_work);
  if (!sizes.completed()) return std::nullopt;
  // The front holds option 0 everywhere (no host memory): it is never empty.
  const int64_t memory = sizes.front().front().memory;
  const ParetoProgram timed(chain, memory, host, restricted, options.max_exact_work);
  const ParetoProgram& program = timed.completed() ? timed : sizes;
  return MinMemoryPlan{memory + chain.input_bytes, program.schedule(memory, host)};
}

}  // namespace detail

std::optional<int64_t> min_host_budget_bytes(const Chain& chain, int64_t budget_bytes,
                                             const OptimalOptions& options) {
  chain.validate();
  const int64_t memory = budget_bytes - chain.input_bytes;
  if (memory < 0) return std::nullopt;
  const detail::ParetoProgram sizes(without_times(chain), memory, chain.max_host_bytes(),
                                    options.forward_all_only_before_backward,
                                    options.max_exact_work);
  if (!sizes.completed()) {
    throw std::length_error(
        "ckpt::plan::min_host_budget_bytes: the program passed options.max_exact_work (" +
        std::to_string(options.max_exact_work) + ") steps on " + std::to_string(chain.size()) +
        " stages. Raise max_exact_work, or merge consecutive stages.");
  }
  std::optional<int64_t> smallest;
  for (const detail::ParetoPoint& p : sizes.front()) {
    smallest = std::min(p.host, smallest.value_or(p.host));
  }
  return smallest;
}

}  // namespace plan
}  // namespace ckpt
