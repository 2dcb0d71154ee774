// rotor's optimal persistent dynamic program (Beaumont et al., "Optimal checkpointing for
// heterogeneous chains", 2019) with several full-storage options per stage (Rockmate), exact
// feasibility conditions for the simulator's memory model, and a min-max program for the
// smallest feasible budget. docs/memory-model.md derives every condition used here.

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/plan/simulator.h"
#include "ckpt/plan/solvers.h"
#include "dp_terms.h"
#include "intervals.h"
#include "min_memory.h"

namespace ckpt {
namespace plan {
namespace {

using detail::Choice;
using detail::Costs;
using detail::forward_all_allowed;
using detail::Step;

constexpr double kInfinity = std::numeric_limits<double>::infinity();
// Steps per entry of the truncated program for long chains: about 0.6 s at 256 stages.
constexpr int kLongChainSteps = 8;

__extension__ typedef __int128 Int128;

// Bytes per entry of the min-max program: a MinMemory and its cost by start.
constexpr double kMinMemoryEntryBytes = 48;

// The budgeted table: (n+1)(n+2)/2 rows of slots + 1 doubles per host level.
double slot_table_bytes(int stages, int slots, int host_levels = 1) {
  const double n = static_cast<double>(stages) + 1;
  return n * (n + 1) / 2 * (slots + 1.0) * sizeof(double) * host_levels;
}

// The host levels of the budgeted table: host_slots + 1 where the host budget can bind, else 1
// (`binds` unknown without a chain: any host budget below unlimited may).
int host_levels(bool binds, const OptimalOptions& options) {
  return binds ? options.host_slots + 1 : 1;
}

// The most stages whose tables (`bytes(stages)`, growing with them) fit the limit, below `stages`.
template <class Bytes>
int most_stages_within(int stages, double limit, const Bytes& bytes) {
  int low = 1, high = stages - 1;
  while (low < high) {
    const int middle = low + (high - low + 1) / 2;
    if (bytes(middle) <= limit) {
      low = middle;
    } else {
      high = middle - 1;
    }
  }
  return low;
}

}  // namespace

namespace detail {

ProgramLimits min_memory_limits(const OptimalOptions& options) {
  return {options.max_min_memory_pairs, kMinMemoryEntryBytes, options.max_table_bytes};
}

ProgramLimits truncated_limits(const OptimalOptions& options, int steps) {
  return {options.max_truncated_pairs, 48 + 16.0 * steps, options.max_table_bytes};
}

Intervals intervals_for(const std::vector<int64_t>& x, const ProgramLimits& limits) {
  return Intervals::within(x, limits.max_pairs,
                           static_cast<double>(limits.max_bytes) / limits.entry_bytes);
}

double program_bytes(int stages, const ProgramLimits& limits) {
  const std::vector<int64_t> equal(static_cast<size_t>(stages) + 2, 1);
  return static_cast<double>(intervals_for(equal, limits).entries()) * limits.entry_bytes;
}

void check_table_size(const char* function, int stages, int slots, const OptimalOptions& options,
                      const ProgramLimits& limits, int levels) {
  const auto limit = static_cast<double>(options.max_table_bytes);
  const auto bytes = [&](int n) {
    return program_bytes(n, limits) + (slots > 0 ? slot_table_bytes(n, slots, levels) : 0.0);
  };
  if (bytes(stages) <= limit) return;
  std::string advice;
  const double room = limit - program_bytes(stages, limits);
  const double per_slot = slot_table_bytes(stages, 1, levels) - slot_table_bytes(stages, 0, levels);
  if (slots > 0 && room >= 2 * per_slot) {
    advice = "Use at most " + std::to_string(static_cast<int64_t>(room / per_slot) - 1) + " slots";
  } else {
    advice = "Merge consecutive stages into at most " +
             std::to_string(most_stages_within(stages, limit, bytes)) +
             " (a stage's times and sizes add up)";
  }
  throw std::length_error(
      std::string(function) + ": planning " + std::to_string(stages) + " stages" +
      (slots > 0 ? " with " + std::to_string(slots) + " slots" : "") + " needs " +
      std::to_string(static_cast<int64_t>(bytes(stages) / 1e6)) + " MB of tables, above " +
      "options.max_table_bytes (" + std::to_string(options.max_table_bytes / 1000000) + " MB). " +
      advice + ", or raise max_table_bytes.");
}

}  // namespace detail

namespace {

// --- The min-max program: the smallest memory of any persistent schedule (exact when dense). ---

struct MinMemory {
  int64_t memory = 0;
  double time = 0.0;
  Step step = Step::Loss;
  int option = 0;
  int j = 0;
};

static_assert(sizeof(MinMemory) + 16 == kMinMemoryEntryBytes, "the estimate counts 48 bytes");

class MinMemorySolver {
 public:
  // `host`: the host memory every option may use, detail::kUnlimitedHost, or 0 for none.
  MinMemorySolver(const Chain& chain, bool restricted, const detail::ProgramLimits& limits,
                  int64_t host)
      : c_(detail::byte_costs(chain)),
        host_(host),
        restricted_(restricted),
        intervals_(detail::intervals_for(c_.x, limits)),
        table_(intervals_.entries()),
        by_start_(intervals_.entries()),
        prefix_(static_cast<size_t>(c_.length) + 1),
        forward_(static_cast<size_t>(c_.length) + 1) {
    // Every entry reads entries of shorter intervals: (i + 1, l), (j, l) and (i, j - 1).
    for (int i = c_.length; i >= 0; --i) {
      fill_forward_input_prefixes(c_, i, prefix_, forward_);
      for (int l = i; l <= c_.length; l = intervals_.next_end(i, l)) solve(i, l);
    }
  }

  int64_t memory() const { return at(0, c_.length).memory + c_.x[0]; }
  const detail::Intervals& intervals() const { return intervals_; }

  Schedule schedule() const {
    Schedule schedule;
    detail::emit_ops(
        c_, 0, c_.length, 0, host_,
        [this](int i, int l, int64_t /*m*/, int64_t /*h*/) {
          const MinMemory& entry = at(i, l);
          return Choice{entry.step, entry.option, entry.j};
        },
        schedule.ops);
    return schedule;
  }

 private:
  const MinMemory& at(int i, int l) const { return table_[intervals_.index(i, l)]; }

  static bool better(const MinMemory& a, const MinMemory& b) {
    return a.memory < b.memory || (a.memory == b.memory && a.time < b.time);
  }

  void solve(int i, int l) {
    MinMemory best{std::numeric_limits<int64_t>::max(), kInfinity, Step::Loss, 0, 0};
    const int length = c_.length;
    if (i == length) {
      best = MinMemory{c_.x[static_cast<size_t>(length)], 0.0, Step::Loss, 0, 0};
    } else {
      const auto si = static_cast<size_t>(i);
      if (forward_all_allowed(restricted_, length, i, l)) {
        for (int k = 0; k < static_cast<int>(c_.saved[si].size()); ++k) {
          if (c_.host_at(i, k) > host_) continue;
          const auto sk = static_cast<size_t>(k);
          MinMemory candidate{c_.forward_all_need(i, l, k),
                              c_.forward_time[si][sk] + c_.backward_time[si][sk], Step::ForwardAll,
                              k, 0};
          if (l > i) {
            const MinMemory& sub = at(i + 1, l);
            candidate.memory = std::max(candidate.memory, c_.saved[si][sk] + sub.memory);
            candidate.time += sub.time;
          }
          if (better(candidate, best)) best = candidate;
        }
      }
      const int64_t after = c_.x[static_cast<size_t>(l) + 1];
      for (int j = intervals_.next_split(i, l, i + 1); j <= l;
           j = intervals_.next_split(i, l, j + 1)) {
        const auto sj = static_cast<size_t>(j);
        const int64_t need = std::max(after + forward_[sj], c_.x[sj]) + c_.gradients_from(l + 1);
        const MinMemory& right = at(j, l);
        const Cost& left = by_start_[intervals_.index_by_start(i, j - 1)];
        MinMemory candidate{std::max({need, c_.x[sj] + right.memory, left.memory}),
                            prefix_[sj] + right.time + left.time, Step::ForwardInput, 0, j};
        if (better(candidate, best)) best = candidate;
      }
    }
    table_[intervals_.index(i, l)] = best;
    by_start_[intervals_.index_by_start(i, l)] = {best.memory, best.time};
  }

  // The entries (i, l) of one i side by side: case (a) walks (i, j - 1) by j.
  struct Cost {
    int64_t memory = 0;
    double time = 0.0;
  };

  Costs c_;
  int64_t host_;
  bool restricted_;
  detail::Intervals intervals_;
  std::vector<MinMemory> table_;
  std::vector<Cost> by_start_;
  std::vector<double> prefix_;
  std::vector<int64_t> forward_;
};

}  // namespace

// --- The budgeted table ---

OptimalTable::OptimalTable(const Chain& chain, int64_t max_budget_bytes,
                           const OptimalOptions& options)
    : chain_(chain), options_(options), max_budget_bytes_(max_budget_bytes) {
  chain_.validate();
  if (options_.slots < 1) {
    throw std::invalid_argument(
        "ckpt::plan::OptimalTable: options.slots must be at least 1, but got " +
        std::to_string(options_.slots) + ". The default, 500, is what rotor uses.");
  }
  if (max_budget_bytes_ < chain_.input_bytes || max_budget_bytes_ < 1) {
    throw std::invalid_argument(
        "ckpt::plan::OptimalTable: max_budget_bytes must be at least the chain's input_bytes (" +
        std::to_string(chain_.input_bytes) + ") and positive, but got " +
        std::to_string(max_budget_bytes_) +
        ". The input is held for the whole step; pass a budget in bytes that includes it.");
  }
  detail::check_host_budget("ckpt::plan::OptimalTable", options_);
  host_levels_ = host_levels(detail::host_binds(chain_, options_), options_);
  detail::check_table_size("ckpt::plan::OptimalTable", chain_.size(), options_.slots, options_,
                           detail::min_memory_limits(options_), host_levels_);
  detail::MinMemoryPlan smallest =
      detail::min_memory_plan("ckpt::plan::OptimalTable", chain_, options_);
  min_feasible_budget_bytes_ = smallest.memory;
  min_memory_schedule_ = std::move(smallest.schedule);
  min_memory_time_ = simulate(chain_, min_memory_schedule_).time;
  units_ = std::make_shared<const Costs>(detail::make_costs(
      chain_, [this](int64_t bytes) { return to_slots(bytes); },
      [this](int64_t bytes) { return to_host_slots(bytes); }));
  build();
}

int64_t OptimalTable::to_slots(int64_t bytes) const {
  // ceil(bytes * slots / max_budget): a slot is max_budget / slots bytes, sizes rounded up.
  const Int128 scaled = static_cast<Int128>(bytes) * options_.slots;
  const Int128 result = (scaled + max_budget_bytes_ - 1) / max_budget_bytes_;
  return static_cast<int64_t>(std::min<Int128>(result, std::numeric_limits<int64_t>::max() / 4));
}

int64_t OptimalTable::to_host_slots(int64_t bytes) const {
  if (host_levels_ == 1) return 0;  // the host budget cannot bind: no host axis
  const int64_t budget = options_.host_budget_bytes;
  if (bytes > budget) return options_.host_slots + 1;  // never fits
  // ceil(bytes * host_slots / budget): sizes rounded up, so a schedule within host_slots fits.
  const Int128 scaled = static_cast<Int128>(bytes) * options_.host_slots;
  return bytes == 0 ? 0 : static_cast<int64_t>((scaled + budget - 1) / budget);
}

int64_t OptimalTable::available_slots(int64_t budget_bytes) const {
  // floor(budget * slots / max_budget): these slots hold at most budget_bytes.
  return static_cast<int64_t>(static_cast<Int128>(budget_bytes) * options_.slots /
                              max_budget_bytes_);
}

namespace {

// The index of the interval (i, l), 0 <= i <= l <= length, in a triangle stored row by row: the
// layout of the table's rows and of build()'s first finite slots.
size_t triangle_index(int length, int i, int l) {
  const auto n = static_cast<size_t>(length + 1);
  const auto si = static_cast<size_t>(i);
  return si * n - si * (si - (si > 0 ? 1 : 0)) / 2 + static_cast<size_t>(l - i);
}

}  // namespace

size_t OptimalTable::row_index(int i, int l, int64_t h) const {
  return triangle_index(chain_.size(), i, l) * static_cast<size_t>(host_levels_) +
         static_cast<size_t>(h);
}

const double* OptimalTable::row(int i, int l, int64_t h) const {
  return table_.data() + row_index(i, l, h) * static_cast<size_t>(options_.slots + 1);
}

double* OptimalTable::row(int i, int l, int64_t h) {
  return const_cast<double*>(static_cast<const OptimalTable*>(this)->row(i, l, h));
}

void OptimalTable::build() {
  const int length = chain_.size();
  const int64_t slots = options_.slots;
  const auto rows = static_cast<size_t>(length + 1) * static_cast<size_t>(length + 2) / 2 *
                    static_cast<size_t>(host_levels_);
  table_.assign(rows * static_cast<size_t>(slots + 1), kInfinity);
  // first[row_index(i, l, h)] = the smallest m with a finite entry (slots + 1 if none): every
  // candidate that reads a row below its first entry is infinite, so those m are skipped.
  std::vector<int64_t> first(rows, slots + 1);

  // NOTE: iterate by interval length d = l - i: every read below is of a shorter interval, so
  // zero-slot sizes are safe (rotor's C loop order is not).
  for (int d = 0; d <= length; ++d) {
    for (int i = 0; i + d <= length; ++i) {
      const int l = i + d;
      if (i == length) {  // the loss: holds δ_L while x_L is held outside
        const int64_t x = units_->x_at(length);
        for (int64_t h = 0; h < host_levels_; ++h) {
          for (int64_t m = x; m <= slots; ++m) row(i, l, h)[m] = 0.0;
          first[row_index(i, l, h)] = std::min<int64_t>(x, slots + 1);
        }
        continue;
      }
      if (forward_all_allowed(options_.forward_all_only_before_backward, length, i, l)) {
        add_forward_all(i, l, first);
      }
      for (int64_t h = 0; h < host_levels_; ++h) {
        add_checkpoints(i, l, h, first);
        const double* out = row(i, l, h);
        int64_t first_finite = 0;
        while (first_finite <= slots && !(out[first_finite] < kInfinity)) ++first_finite;
        first[row_index(i, l, h)] = first_finite;
      }
    }
  }
}

// Case (b): stage i runs forward_all with option k, then Opt(i + 1, l) with its saved bytes (and
// its host slots) held.
void OptimalTable::add_forward_all(int i, int l, const std::vector<int64_t>& first) {
  const Costs& c = *units_;
  const int64_t slots = options_.slots;
  for (int k = 0; k < c.options(i); ++k) {
    const double cost = c.forward_backward_time(i, k);
    const int64_t need = c.forward_all_need(i, l, k);
    const int64_t host = c.host_at(i, k);
    for (int64_t h = host; h < host_levels_; ++h) {
      double* __restrict out = row(i, l, h);
      if (l == i) {
        for (int64_t m = need; m <= slots; ++m) out[m] = std::min(out[m], cost);
        continue;
      }
      const int64_t saved = c.saved_at(i, k);
      const double* __restrict sub = row(i + 1, l, h - host);
      const int64_t start = std::max(need, first[row_index(i + 1, l, h - host)] + saved);
      for (int64_t m = start; m <= slots; ++m) out[m] = std::min(out[m], cost + sub[m - saved]);
    }
  }
}

// Case (a): forwards without storing from i to a checkpoint j, Opt(j, l) with x_j held, then
// Opt(i, j - 1), for every j in (i, l], both within the same host slots h.
void OptimalTable::add_checkpoints(int i, int l, int64_t h, const std::vector<int64_t>& first) {
  const Costs& c = *units_;
  const int64_t slots = options_.slots;
  double* __restrict out = row(i, l, h);
  double prefix = 0.0;
  int64_t forward = detail::first_forward(c, i);
  for (int j = i + 1; j <= l; ++j) {
    prefix += c.time[static_cast<size_t>(j - 1)];
    const int64_t need = detail::forward_input_need(c, i, j, l, forward);
    const int64_t shift = c.x_at(j);
    const double* __restrict right = row(j, l, h);
    const double* __restrict left = row(i, j - 1, h);
    const int64_t start =
        std::max({need, first[row_index(j, l, h)] + shift, first[row_index(i, j - 1, h)]});
    for (int64_t m = start; m <= slots; ++m) {
      out[m] = std::min(out[m], (prefix + right[m - shift]) + left[m]);
    }
  }
}

detail::Choice OptimalTable::best_choice(int i, int l, int64_t m, int64_t h) const {
  return detail::best_choice(
      *units_, options_.forward_all_only_before_backward, i, l, m, h,
      [this](int a, int b, int64_t at, int64_t host) { return row(a, b, host)[at]; },
      [](int) { return true; });
}

void OptimalTable::check_budget(const char* function, int64_t budget_bytes) const {
  if (budget_bytes < chain_.input_bytes) {
    throw std::invalid_argument(
        std::string(function) + ": budget_bytes must be at least the chain's input_bytes (" +
        std::to_string(chain_.input_bytes) + "), but got " + std::to_string(budget_bytes) +
        ". The input is held for the whole step; pass a budget in bytes "
        "that includes it.");
  }
  if (budget_bytes > max_budget_bytes_) {
    throw std::invalid_argument(
        std::string(function) + ": budget_bytes must be at most the table's max_budget_bytes (" +
        std::to_string(max_budget_bytes_) + "), but got " + std::to_string(budget_bytes) +
        ". Build the OptimalTable with a larger max_budget_bytes.");
  }
}

double OptimalTable::time(int64_t budget_bytes) const {
  check_budget("ckpt::plan::OptimalTable::time", budget_bytes);
  const int64_t m = available_slots(budget_bytes) - units_->x_at(0);
  double best = m >= 0 ? row(0, chain_.size(), host_levels_ - 1)[m] : kInfinity;
  if (budget_bytes >= min_feasible_budget_bytes_) best = std::min(best, min_memory_time_);
  return best;
}

std::optional<Schedule> OptimalTable::solve(int64_t budget_bytes) const {
  check_budget("ckpt::plan::OptimalTable::solve", budget_bytes);
  const int64_t m = available_slots(budget_bytes) - units_->x_at(0);
  const int64_t h = host_levels_ - 1;  // the whole host budget
  const double table_time = m >= 0 ? row(0, chain_.size(), h)[m] : kInfinity;
  if (budget_bytes >= min_feasible_budget_bytes_ && !(table_time <= min_memory_time_)) {
    return min_memory_schedule_;
  }
  if (table_time == kInfinity) return std::nullopt;
  Schedule schedule;
  schedule.ops.reserve(static_cast<size_t>(4 * chain_.size() + 1));
  detail::emit_ops(
      *units_, 0, chain_.size(), m, h,
      [this](int i, int l, int64_t at, int64_t host) { return best_choice(i, l, at, host); },
      schedule.ops);
  return schedule;
}

namespace {

// Storing everything runs each stage once, with option 0: the fastest schedule there is when
// option 0 is each stage's fastest and the schedule fits.
std::optional<Schedule> store_everything_if_fastest(const Chain& chain, int64_t budget_bytes) {
  for (const Stage& stage : chain.stages) {
    const StorageOption own = stage.option(0);
    const double plain = chain.forward_all_time(own) + chain.backward_time(own);
    for (const StorageOption& option : stage.alternatives) {
      if (chain.forward_all_time(option) + chain.backward_time(option) < plain) return std::nullopt;
    }
  }
  Schedule all = solve_no_checkpoint(chain);
  const SimulationResult result = simulate(chain, all);
  if (result.valid && result.peak_bytes <= budget_bytes) return all;
  return std::nullopt;
}

// The table rounds sizes up to slots and so wastes up to a slot per live size: it is asked for
// budgets above `budget_bytes`, by up to one slot per stage, and the fastest answer whose exact
// simulated peak fits wins (binary search for the largest such ask). Below the table's first
// answer, the minimum-memory schedule is the answer.
std::optional<Schedule> solve_refined(const Chain& chain, int64_t budget_bytes,
                                      const OptimalOptions& options) {
  const Int128 slack = static_cast<Int128>(budget_bytes) * (chain.size() + 3) / options.slots;
  const auto top = static_cast<int64_t>(
      std::min<Int128>(budget_bytes + slack, std::max(budget_bytes, Chain::kMaxTotalBytes)));
  const OptimalTable table(chain, top, options);
  if (budget_bytes < table.min_feasible_budget_bytes()) return std::nullopt;
  Schedule best = *table.solve(budget_bytes);  // fits: sizes were rounded up
  double best_time = simulate(chain, best).time;
  detail::search_asks(
      chain, budget_bytes, budget_bytes + 1, top, [&](int64_t asked) { return table.solve(asked); },
      best, best_time);
  return best;
}

// Long chains: the grouped table; where its groups fit nothing but the minimum-memory schedule
// (near the smallest budget), the truncated exact program, which is exact there or close.
// Whether solve_optimal refines a long chain's answer near its smallest budget with the truncated
// program: while that takes at most 4 * max_truncated_pairs pairs (about 5900 stages by default;
// its cost grows as L^2) and its tables fit the limit beside the min-max program's.
bool refines_long_chain(int stages, const OptimalOptions& options) {
  const detail::ProgramLimits limits = detail::truncated_limits(options, kLongChainSteps);
  const std::vector<int64_t> equal(static_cast<size_t>(stages) + 2, 1);
  const detail::Intervals intervals = detail::intervals_for(equal, limits);
  const double bytes = detail::program_bytes(stages, detail::min_memory_limits(options)) +
                       static_cast<double>(intervals.entries()) * limits.entry_bytes;
  return intervals.pairs() / 4 <= options.max_truncated_pairs &&
         bytes <= static_cast<double>(options.max_table_bytes);
}

std::optional<Schedule> solve_long(const Chain& chain, int64_t budget_bytes,
                                   const OptimalOptions& options) {
  detail::MinMemoryPlan smallest =
      detail::min_memory_plan("ckpt::plan::solve_optimal", chain, options);
  const Schedule min_memory = smallest.schedule;
  std::optional<Schedule> grouped =
      detail::solve_grouped(chain, budget_bytes, options.groups, options, std::move(smallest));
  if (!grouped || *grouped != min_memory || !refines_long_chain(chain.size(), options)) {
    return grouped;
  }
  std::optional<Schedule> truncated =
      solve_truncated(chain, budget_bytes, kLongChainSteps, options);
  if (truncated && simulate(chain, *truncated).time < simulate(chain, *grouped).time) {
    return truncated;
  }
  return grouped;
}

// The programs count no executor state (docs/memory-model.md, "Random state" and "Buffers"): they
// plan the chain without it, at the budget and then for as much less as the plan went over (the
// stashes and buffer copies of the stages it runs again), and last for the most the state can
// add; the minimum-memory schedule answers the budgets where none of those fits.
std::optional<Schedule> solve_keeping_executor_state(const Chain& chain, int64_t budget_bytes,
                                                     const OptimalOptions& options) {
  Chain without = chain;
  without.random_state_bytes = 0;
  for (Stage& stage : without.stages) {
    stage.random_state_bytes = 0;
    stage.buffer_bytes = 0;
    stage.kept_buffer_bytes = 0;
  }
  detail::MinMemoryPlan smallest =
      detail::min_memory_plan("ckpt::plan::solve_optimal", chain, options);
  if (budget_bytes < smallest.memory) return std::nullopt;
  constexpr int kAttempts = 4;
  int64_t less = budget_bytes;
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    if (attempt + 1 == kAttempts) less = budget_bytes - chain.executor_state_reserve();
    if (less < std::max<int64_t>(chain.input_bytes, 1)) break;
    std::optional<Schedule> schedule = solve_optimal(without, less, options);
    if (!schedule) break;  // nothing fits in less either
    const int64_t over = simulate(chain, *schedule).peak_bytes - budget_bytes;
    if (over <= 0) return schedule;
    less -= over;
  }
  return std::move(smallest.schedule);
}

}  // namespace

std::optional<Schedule> solve_optimal(const Chain& chain, int64_t budget_bytes,
                                      const OptimalOptions& options) {
  chain.validate();
  detail::check_host_budget("ckpt::plan::solve_optimal", options);
  if (budget_bytes < chain.input_bytes || budget_bytes < 1) {
    throw std::invalid_argument(
        "ckpt::plan::solve_optimal: budget_bytes must be at least the chain's input_bytes (" +
        std::to_string(chain.input_bytes) + ") and positive, but got " +
        std::to_string(budget_bytes) +
        ". The input is held for the whole step; pass a budget in bytes that includes it.");
  }
  if (options.slots < 1) {
    throw std::invalid_argument(
        "ckpt::plan::solve_optimal: options.slots must be at least 1, but got " +
        std::to_string(options.slots) + ".");
  }
  if (!options.forward_all_only_before_backward) {
    if (auto all = store_everything_if_fastest(chain, budget_bytes)) return all;
  }
  if (chain.executor_state_reserve() > 0) {
    return solve_keeping_executor_state(chain, budget_bytes, options);
  }
  ExactSolution exact = solve_exact(chain, budget_bytes, options.max_exact_work, options);
  if (exact.status != ExactSolution::Status::OverWorkLimit) return std::move(exact.schedule);
  if (chain.size() > options.max_exact_stages) return solve_long(chain, budget_bytes, options);
  return solve_refined(chain, budget_bytes, options);
}

int64_t optimal_table_bytes(int stages, const OptimalOptions& options) {
  return detail::table_bytes(stages, options,
                             options.host_budget_bytes < std::numeric_limits<int64_t>::max());
}

int64_t optimal_table_bytes(const Chain& chain, const OptimalOptions& options) {
  chain.validate();
  return detail::table_bytes(chain.size(), options, detail::host_binds(chain, options));
}

namespace detail {

int64_t table_bytes(int stages, const OptimalOptions& options, bool host_binds) {
  const bool long_chain = stages > options.max_exact_stages;
  const bool refined = long_chain && refines_long_chain(stages, options);
  const double bytes =
      detail::program_bytes(stages, detail::min_memory_limits(options)) +
      (refined ? detail::program_bytes(stages, detail::truncated_limits(options, kLongChainSteps))
               : 0.0) +
      slot_table_bytes(long_chain ? options.groups : stages, options.slots,
                       host_levels(host_binds && !long_chain, options));
  return bytes < 9.2e18 ? static_cast<int64_t>(bytes) : std::numeric_limits<int64_t>::max();
}

}  // namespace detail

int64_t min_feasible_budget_bytes(const Chain& chain, const OptimalOptions& options) {
  return detail::min_memory_plan("ckpt::plan::min_feasible_budget_bytes", chain, options).memory;
}

Schedule solve_min_memory(const Chain& chain, const OptimalOptions& options) {
  return detail::min_memory_plan("ckpt::plan::solve_min_memory", chain, options).schedule;
}

namespace detail {

void search_asks(const Chain& chain, int64_t budget_bytes, int64_t low, int64_t high,
                 const std::function<std::optional<Schedule>(int64_t)>& answer, Schedule& best,
                 double& best_time) {
  while (low <= high) {
    const int64_t asked = low + (high - low) / 2;
    std::optional<Schedule> schedule = answer(asked);
    const SimulationResult result = schedule ? simulate(chain, *schedule) : SimulationResult{};
    if (!result.valid || result.peak_bytes > budget_bytes) {
      high = asked - 1;
      continue;
    }
    if (result.time < best_time) {
      best = std::move(*schedule);
      best_time = result.time;
    }
    low = asked + 1;
  }
}

namespace {

// The programs count no executor state (`Chain::executor_state_reserve`): the smallest budget is
// the schedule's simulated peak where that is more, or the plain chain's where that is less (a
// stage's stash can outweigh what recomputing it saves).
MinMemoryPlan with_executor_state(const Chain& chain, MinMemoryPlan plan) {
  if (chain.executor_state_reserve() == 0) return plan;
  plan.memory = std::max(plan.memory, simulate(chain, plan.schedule).peak_bytes);
  Schedule plain = solve_no_checkpoint(chain);
  const int64_t plain_peak = simulate(chain, plain).peak_bytes;
  if (plain_peak <= plan.memory) return {plain_peak, std::move(plain)};
  return plan;
}

}  // namespace

MinMemoryPlan min_memory_plan(const char* function, const Chain& chain,
                              const OptimalOptions& options) {
  chain.validate();
  check_host_budget(function, options);
  check_table_size(function, chain.size(), 0, options, min_memory_limits(options));
  const bool binds = host_binds(chain, options);
  if (binds) {
    if (std::optional<MinMemoryPlan> exact = min_memory_within_host(chain, options)) {
      return with_executor_state(chain, std::move(*exact));
    }
  }
  // Where the host budget binds and the Pareto program is too long, no option offloads.
  const MinMemorySolver solver(chain, options.forward_all_only_before_backward,
                               min_memory_limits(options), binds ? 0 : kUnlimitedHost);
  return with_executor_state(chain, {solver.memory(), solver.schedule()});
}

}  // namespace detail

}  // namespace plan
}  // namespace ckpt
