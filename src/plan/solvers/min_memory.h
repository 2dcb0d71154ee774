#pragma once

// For the solvers built on optimal.cpp's table (the refined table, grouped.cpp): the min-max
// program (the smallest memory of any persistent schedule and a schedule that reaches it, from
// one run), and the search over the budgets a table is asked for.

#include "ckpt/plan/chain.h"
#include "ckpt/plan/schedule.h"
#include "ckpt/plan/solvers.h"

#include <cstdint>
#include <functional>
#include <optional>

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

/// The budgets a table is asked for need not be the real budget (its sizes are rounded or
/// estimated): a binary search over asks in [low, high] for the largest whose answer
/// (`answer(asked)`, a schedule of `chain`) fits `budget_bytes` when simulated. The fastest
/// fitting answer seen replaces `best` when it is faster than `best_time`.
void search_asks(const Chain& chain, int64_t budget_bytes, int64_t low, int64_t high,
                 const std::function<std::optional<Schedule>(int64_t)>& answer, Schedule& best,
                 double& best_time);

}  // namespace detail
}  // namespace plan
}  // namespace ckpt
