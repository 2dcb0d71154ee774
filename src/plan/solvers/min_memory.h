#pragma once

// The min-max program of optimal.cpp, for the solvers built on it (grouped.cpp): the smallest
// memory of any persistent schedule and a schedule that reaches it, from one run.

#include "ckpt/plan/chain.h"
#include "ckpt/plan/schedule.h"
#include "ckpt/plan/solvers.h"

#include <cstdint>

namespace ckpt {
namespace plan {
namespace detail {

struct MinMemoryPlan {
  int64_t memory = 0;  // min_feasible_budget_bytes
  Schedule schedule;   // solve_min_memory
};

/// Validates the chain and checks the table size like min_feasible_budget_bytes (`function`
/// names the caller in errors).
MinMemoryPlan min_memory_plan(const char* function, const Chain& chain,
                              const OptimalOptions& options);

}  // namespace detail
}  // namespace plan
}  // namespace ckpt
