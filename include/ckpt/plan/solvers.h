#pragma once

// Schedule solvers: no checkpointing, PyTorch's checkpoint_sequential, Chen's √n, Revolve
// (binomial checkpointing) and rotor's optimal persistent dynamic program under a byte budget.
// Every returned schedule is valid for `simulate` (docs/memory-model.md).

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include "ckpt/plan/chain.h"
#include "ckpt/plan/schedule.h"

namespace ckpt {
namespace plan {
namespace detail {
struct Costs;
struct Choice;
}  // namespace detail

// ~~~ Baselines ~~~

/// Stores everything: Fall_0 .. Fall_{L-1}, Loss, B_{L-1} .. B_0 (option 0 everywhere).
Schedule solve_no_checkpoint(const Chain& chain);

/// PyTorch's `checkpoint_sequential(functions, segments, input)` as a schedule.
///
/// Segment size is L / segments (integer division). Each of the first `segments - 1` segments
/// runs Fck on its first stage and Fn on the others in the forward, then, when the backward
/// reaches it, Fall on every stage of the segment and B in reverse. The last segment (from
/// (segments-1)*size to L-1) runs with Fall. Throws std::invalid_argument unless
/// 1 <= segments <= L.
Schedule solve_uniform(const Chain& chain, int segments);

/// Chen et al.'s √n heuristic: `solve_uniform` with round(sqrt(L)) segments (at least 1).
Schedule solve_sqrt_n(const Chain& chain);

// ~~~ Revolve (homogeneous chains) ~~~

/// Griewank & Walther's minimal number of forward (advance) steps to reverse `steps` steps
/// with `slots` checkpoint slots (the initial state occupies one), closed form:
/// t(l, s) = r*l - C(s+r, s+1) with C(s+r-1, s) < l <= C(s+r, s). Each reverse step re-runs its
/// own forward (taped), which is not counted. Throws std::invalid_argument unless steps >= 1 and
/// slots >= 1.
int64_t revolve_forward_count(int steps, int slots);

/// The same number from the dynamic program T(1,s) = 0, T(l,1) = l(l-1)/2,
/// T(l,s) = min_{1<=j<l} j + T(l-j, s-1) + T(j, s) (a table of l*s entries, O(l) work each).
int64_t revolve_forward_count_dp(int steps, int slots);

/// Binomial checkpointing in rotor's op language, optimal in forward count for homogeneous
/// chains: the L stages are Revolve's L steps, Fck/Fn advance, and each reverse step re-runs
/// its own forward with Fall (option 0) right before its backward; the last stage's reverse
/// step is `Fall_{L-1} L B_{L-1}`. `slots` counts x_0. The schedule is valid for any chain; its
/// forward count is `revolve_forward_count(L, slots) + L`, and on a chain of unit sizes its
/// peak is at most slots + 4 units (the optimal DP restricted to this model matches it there).
/// Throws std::invalid_argument unless slots >= 1.
Schedule solve_revolve(const Chain& chain, int slots);

// ~~~ Optimal persistent schedules (rotor) ~~~

/// Options of the optimal dynamic program. The limits below bound work and memory; what that
/// work takes on one machine is measured in bench/results.md ("Planner costs").
struct OptimalOptions {
  /// Memory is discretised into this many slots of budget/slots bytes; every size is rounded
  /// up to whole slots, so returned schedules never exceed the budget. Default: 500
  int slots = 500;
  /// When true, forward_all is only used right before the stage's own backward, with only the
  /// loss in between for the last stage (the Revolve / automatic-differentiation model); for
  /// comparisons and tests. Default: false
  bool forward_all_only_before_backward = false;
  /// The most memory the program may allocate for its tables, checked before any work
  /// (optimal_table_bytes); a larger problem throws std::length_error with the estimate.
  /// Default: 1 GiB
  int64_t max_table_bytes = int64_t{1} << 30;
  /// solve_optimal solves chains of more stages with solve_grouped in `groups` groups: the exact
  /// table takes O(L^3 * slots) time. Default: 200
  int max_exact_stages = 200;
  /// Groups of solve_optimal's long chains. Default: 128
  int groups = 128;
  /// Steps solve_optimal lets the exact program compute (solve_exact) before it uses the table
  /// instead. Default: 2000000
  int64_t max_exact_work = 2000000;
  /// The min-max program (min_feasible_budget_bytes, solve_min_memory) is exact (dense) while
  /// its pairs of an entry and a checkpoint, (L+1)(L+2)(L+3)/6, are at most this (up to 1000
  /// stages with the default) and its entries fit max_table_bytes. Longer chains get the
  /// sparse program (docs/memory-model.md, "Long chains"): O(L^2) time, O(L^1.5) memory, and a
  /// minimum that may lie above the exact one (measured: by at most one activation).
  /// Default: 170000000
  int64_t max_min_memory_pairs = 170000000;
  /// The same for solve_truncated: dense up to 390 stages with the default. solve_optimal runs it
  /// on long chains near their smallest budget while its sparse pairs are at most 4 times this
  /// (about 5900 stages). Default: 10000000
  int64_t max_truncated_pairs = 10000000;
  /// Host memory for offloaded activations (StorageOption::offloaded_bytes): no returned
  /// schedule's simulated host_peak_bytes exceeds it. Default: unlimited
  int64_t host_budget_bytes = std::numeric_limits<int64_t>::max();
  /// Where the host budget can bind (below Chain::max_host_bytes()) the budgeted table adds a
  /// host axis of host_slots + 1 levels of host_budget_bytes / host_slots bytes, offloaded sizes
  /// rounded up (docs/memory-model.md, "Offloading"). Default: 16
  int host_slots = 16;
};

/// The bytes of the tables the optimal solver allocates for a chain of `stages` stages with
/// `options` (at most; the sparse programs' entries depend a little on the sizes): the budgeted
/// table, (n+1)(n+2)/2 * (slots+1) doubles for n = stages, times host_slots + 1 when
/// options.host_budget_bytes is not unlimited, or n = options.groups past
/// options.max_exact_stages (groups never offload); the min-max program's entries, 48 bytes each
/// ((L+1)(L+2)/2 of them when dense, about 2.9 L^1.5 when sparse); and past max_exact_stages, where
/// solve_optimal refines with it, the truncated program's, 176 bytes each. Saturates at INT64_MAX.
int64_t optimal_table_bytes(int stages, const OptimalOptions& options = {});

/// optimal_table_bytes for `chain`: the budgeted table has host_slots + 1 host levels only where
/// options.host_budget_bytes can bind (below chain.max_host_bytes()); the overload without a chain
/// counts them for any host budget but the unlimited one. Throws as Chain::validate does.
int64_t optimal_table_bytes(const Chain& chain, const OptimalOptions& options = {});

/// rotor's dynamic program (docs/memory-model.md, "The optimal solver"), built once for a
/// chain and a maximum budget; it then answers any budget up to that maximum without
/// re-solving, with the same discretisation (slot = max_budget_bytes / slots).
///
/// Example:
/// ```
/// ckpt::plan::OptimalTable table(chain, 512 << 20);
/// for (int64_t budget : budgets) {
///   if (auto schedule = table.solve(budget)) run(*schedule);
/// }
/// ```
class OptimalTable {
 public:
  /// Builds the table: O(slots * L^3 * options) time, O(slots * L^2) memory. Throws
  /// std::invalid_argument if the chain is invalid, options.slots < 1, or max_budget_bytes
  /// is smaller than the chain's input_bytes, and std::length_error, before allocating, when
  /// optimal_table_bytes exceeds options.max_table_bytes.
  OptimalTable(const Chain& chain, int64_t max_budget_bytes, const OptimalOptions& options = {});

  /// The fastest persistent schedule whose simulated peak is at most `budget_bytes`, or
  /// std::nullopt when none exists. Near the minimum feasible budget, where rounding to slots
  /// leaves the table without a solution, it returns the minimum-memory schedule when that
  /// fits. Throws std::invalid_argument unless input_bytes <= budget_bytes <= max_budget_bytes().
  std::optional<Schedule> solve(int64_t budget_bytes) const;

  /// The predicted time of `solve(budget_bytes)` (+infinity when it returns std::nullopt).
  double time(int64_t budget_bytes) const;

  /// The smallest budget of any persistent schedule, min_feasible_budget_bytes(chain, options):
  /// exact in bytes while the min-max program is dense (independent of the slots). `solve`
  /// succeeds from there on.
  int64_t min_feasible_budget_bytes() const { return min_feasible_budget_bytes_; }

  int64_t max_budget_bytes() const { return max_budget_bytes_; }
  int slots() const { return options_.slots; }
  const Chain& chain() const { return chain_; }

 private:
  int64_t to_slots(int64_t bytes) const;
  int64_t to_host_slots(int64_t bytes) const;
  int64_t available_slots(int64_t budget_bytes) const;
  size_t row_index(int i, int l, int64_t h) const;
  const double* row(int i, int l, int64_t h) const;
  double* row(int i, int l, int64_t h);
  void build();
  // The two cases of the recursion for the entry (i, l) (at host level h for case (a)); `first`
  // holds each shorter row's first finite slot.
  void add_forward_all(int i, int l, const std::vector<int64_t>& first);
  void add_checkpoints(int i, int l, int64_t h, const std::vector<int64_t>& first);
  detail::Choice best_choice(int i, int l, int64_t m, int64_t h) const;
  void check_budget(const char* function, int64_t budget_bytes) const;

  Chain chain_;
  OptimalOptions options_;
  // Host levels of the table: options.host_slots + 1 where the host budget can bind, else 1.
  int64_t host_levels_ = 1;
  int64_t max_budget_bytes_ = 0;
  int64_t min_feasible_budget_bytes_ = 0;
  Schedule min_memory_schedule_;
  double min_memory_time_ = 0.0;
  // The chain's sizes in slots.
  std::shared_ptr<const detail::Costs> units_;
  // Opt[i][l][h][m] for 0 <= i <= l <= L, host level h and m in [0, slots], rows of slots+1
  // contiguous values.
  std::vector<double> table_;
};

/// The fastest persistent schedule (rotor's optimum, up to the slot discretisation) whose
/// simulated peak is at most `budget_bytes`, or std::nullopt when none exists. Equivalent to
/// `OptimalTable(chain, budget_bytes, options).solve(budget_bytes)` for chains of up to
/// options.max_exact_stages stages, and to `solve_grouped(chain, budget_bytes, options.groups,
/// options)` past that. Throws std::invalid_argument if the chain is invalid, options.slots < 1,
/// or budget_bytes is smaller than the chain's input_bytes.
std::optional<Schedule> solve_optimal(const Chain& chain, int64_t budget_bytes,
                                      const OptimalOptions& options = {});

/// What solve_exact found.
struct ExactSolution {
  enum class Status {
    Solved,        ///< `schedule` is the byte-exact optimum
    Infeasible,    ///< no persistent schedule fits the budget
    OverWorkLimit  ///< stopped after `max_work` steps; nothing is known
  };
  Status status = Status::Infeasible;
  std::optional<Schedule> schedule;
  /// Steps the program computed (OptimalOptions::max_exact_work counts these).
  int64_t work = 0;
};

/// rotor's dynamic program in exact bytes: each entry Opt(i, l, ·) is a nonincreasing step
/// function of the memory, kept as its steps up to the budget, so the schedule is the fastest
/// persistent schedule whose simulated peak fits `budget_bytes`, with no rounding. Its cost is
/// O(L^3 · K) for entries of K steps; K is small near the smallest feasible budget and for short
/// chains, and grows with both. It answers `OverWorkLimit` at once when its pairs of an entry and
/// a checkpoint alone, (L+1)(L+2)(L+3)/6, exceed `max_work` (each costs a step or more), and
/// stops with it once it has computed `max_work`
/// steps. Only options.forward_all_only_before_backward matters here.
ExactSolution solve_exact(const Chain& chain, int64_t budget_bytes, int64_t max_work,
                          const OptimalOptions& options = {});

/// solve_exact's program keeping only the first `steps` steps of each entry (its smallest
/// memories; the last one answers every larger memory too): the schedule fits the budget and is
/// the optimum wherever no entry was cut, near the smallest feasible budget in particular. For
/// chains too long for solve_exact: O(L^3 · steps) time up to options.max_truncated_pairs
/// (L^3 / 6), past that the sparse program of docs/memory-model.md, "Long chains" (O(L^2 · steps)
/// time, O(L^1.5 · steps) memory), optimal among the schedules it allows. std::nullopt when no
/// schedule fits. Throws std::invalid_argument unless steps >= 1, and std::length_error before
/// allocating tables above options.max_table_bytes.
std::optional<Schedule> solve_truncated(const Chain& chain, int64_t budget_bytes, int steps,
                                        const OptimalOptions& options = {});

/// For chains too long for the exact table: stages are grouped into `groups` runs of consecutive
/// stages (lengths differing by at most one), the table is solved on the chain of groups, and
/// its schedules are expanded back to the stages (a group's Fck is Fck of its first stage and Fn
/// of the others, its Fall and B those of every member) and simulated on the real chain. Returns
/// the fastest expansion whose simulated peak is at most `budget_bytes`, or the minimum-memory
/// schedule when that is faster or nothing else fits; std::nullopt below
/// min_feasible_budget_bytes. Optimal among schedules that keep activations only at group borders
/// and use option 0, up to the estimated group sizes; the result always fits the budget.
/// O(L^3 + groups^3 * slots) time. Throws std::invalid_argument as solve_optimal does, or when
/// groups < 1.
std::optional<Schedule> solve_grouped(const Chain& chain, int64_t budget_bytes, int groups,
                                      const OptimalOptions& options = {});

/// The smallest budget for which a persistent schedule exists within options.host_budget_bytes
/// of host memory: exact in bytes while the min-max program is dense (options.max_min_memory_pairs,
/// up to 1000 stages by default) and, where the host budget binds, while the Pareto program of
/// docs/memory-model.md, "Offloading" takes at most options.max_exact_work steps (past that, the
/// smallest without offloading, an upper bound); past that the
/// sparse program's, a schedule's exact peak, never below the exact minimum nor above storing
/// everything (docs/memory-model.md, "Long chains"). Only `forward_all_only_before_backward`,
/// `max_min_memory_pairs` and `max_table_bytes` matter here; std::length_error before allocating
/// tables above max_table_bytes, with the stages that would fit.
int64_t min_feasible_budget_bytes(const Chain& chain, const OptimalOptions& options = {});

/// A persistent schedule whose simulated peak is `min_feasible_budget_bytes(chain, options)`
/// (the fastest among the memory-minimal choices at each step of the min-max program).
Schedule solve_min_memory(const Chain& chain, const OptimalOptions& options = {});

/// The smallest host budget (options.host_budget_bytes) with which a persistent schedule fits
/// `budget_bytes` of device memory: exact (the Pareto program of docs/memory-model.md,
/// "Offloading", on the chain with every time 0); 0 when no offloading is needed. std::nullopt
/// when no schedule fits the device budget even with unlimited host memory. Throws
/// std::length_error when the program passes options.max_exact_work steps.
std::optional<int64_t> min_host_budget_bytes(const Chain& chain, int64_t budget_bytes,
                                             const OptimalOptions& options = {});

}  // namespace plan
}  // namespace ckpt
