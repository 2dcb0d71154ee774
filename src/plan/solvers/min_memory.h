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
#include <vector>

#include "intervals.h"

namespace ckpt {
namespace plan {
namespace detail {

struct MinMemoryPlan {
  int64_t memory = 0;  // min_feasible_budget_bytes
  Schedule schedule;   // solve_min_memory
};

/// What a program on rotor's entries may take: the dense structure (exact) while its pairs are
/// at most `max_pairs` and its entries, `entry_bytes` each, at most `max_bytes`; the sparse one
/// otherwise (intervals.h).
struct ProgramLimits {
  int64_t max_pairs = 0;
  double entry_bytes = 0;
  int64_t max_bytes = 0;
};

/// The min-max program's: options.max_min_memory_pairs, 48 bytes an entry.
ProgramLimits min_memory_limits(const OptimalOptions& options);
/// The truncated program's: options.max_truncated_pairs, 48 bytes and `steps` steps an entry.
ProgramLimits truncated_limits(const OptimalOptions& options, int steps);
/// The entries and checkpoints of a program on a chain with activations `x` (|x_0| ... |x_L|, 0).
Intervals intervals_for(const std::vector<int64_t>& x, const ProgramLimits& limits);
/// The bytes of a program's entries on `stages` stages: an upper bound over chains of that length
/// (equal activations put each anchor last in its segment, which gives the most entries).
double program_bytes(int stages, const ProgramLimits& limits);

/// Throws std::length_error, before anything is allocated, when a program's entries
/// (program_bytes) and, with slots > 0, the budgeted table (of `host_levels` host levels) exceed
/// options.max_table_bytes; the message gives the estimate and the slots or the stages that would
/// fit.
void check_table_size(const char* function, int stages, int slots, const OptimalOptions& options,
                      const ProgramLimits& limits, int host_levels = 1);

/// Throws std::invalid_argument, naming `function`, unless options.host_budget_bytes >= 0.
void check_host_budget(const char* function, const OptimalOptions& options);

/// Whether options.host_budget_bytes can bind: it is below Chain::max_host_bytes().
inline bool host_binds(const Chain& chain, const OptimalOptions& options) {
  return options.host_budget_bytes < chain.max_host_bytes();
}

/// Validates the chain and checks the table size like min_feasible_budget_bytes (`function`
/// names the caller in errors).
MinMemoryPlan min_memory_plan(const char* function, const Chain& chain,
                              const OptimalOptions& options);

/// solve_grouped (the chain valid, groups >= 1) with the chain's min-max plan computed already.
std::optional<Schedule> solve_grouped(const Chain& chain, int64_t budget_bytes, int groups,
                                      const OptimalOptions& options, MinMemoryPlan smallest);

/// The min-max plan where the host budget binds, from the Pareto program (pareto.h) on the chain
/// with every time 0: exact, the fastest schedule at that memory where the program on the real
/// times finishes too. std::nullopt when the program passes options.max_exact_work.
std::optional<MinMemoryPlan> min_memory_within_host(const Chain& chain,
                                                    const OptimalOptions& options);

/// optimal_table_bytes with `host_binds` saying whether the table has a host axis.
int64_t table_bytes(int stages, const OptimalOptions& options, bool host_binds);

/// The budgets a table is asked for need not be the real budget (its sizes are rounded or
/// estimated): a binary search over asks in [low, high] for the largest whose answer
/// (`answer(asked)`, a schedule of `chain`) fits `budget_bytes` when simulated (no host check:
/// the tables' answers fit the host budget they were built for). The fastest fitting answer seen
/// replaces `best` when it is faster than `best_time`.
void search_asks(const Chain& chain, int64_t budget_bytes, int64_t low, int64_t high,
                 const std::function<std::optional<Schedule>(int64_t)>& answer, Schedule& best,
                 double& best_time);

}  // namespace detail
}  // namespace plan
}  // namespace ckpt
