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

#include "ckpt/plan/solvers.h"
#include "min_memory.h"

namespace ckpt {
namespace plan {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

__extension__ typedef __int128 Int128;

// Sizes and times of a chain in some memory unit (bytes, or slots of the table).
struct Costs {
  int length = 0;
  std::vector<int64_t> x;    // |x_i|, i in [0, L+1], x[L+1] = 0
  std::vector<int64_t> tmp;  // no-grad forward temporaries of stage i
  std::vector<double> time;  // no-grad forward time of stage i
  std::vector<std::vector<int64_t>> saved, forward_tmp, backward_tmp;
  std::vector<std::vector<double>> forward_time, backward_time;
};

template <class Convert>
Costs make_costs(const Chain& chain, Convert convert) {
  Costs costs;
  costs.length = chain.size();
  const auto length = static_cast<size_t>(costs.length);
  costs.x.resize(length + 2, 0);
  for (int i = 0; i <= costs.length; ++i) {
    costs.x[static_cast<size_t>(i)] = convert(chain.activation_bytes(i));
  }
  costs.tmp.resize(length);
  costs.time.resize(length);
  costs.saved.resize(length);
  costs.forward_tmp.resize(length);
  costs.backward_tmp.resize(length);
  costs.forward_time.resize(length);
  costs.backward_time.resize(length);
  for (size_t i = 0; i < length; ++i) {
    const Stage& stage = chain.stages[i];
    costs.tmp[i] = convert(stage.forward_tmp_bytes);
    costs.time[i] = stage.forward_time;
    for (int k = 0; k < stage.option_count(); ++k) {
      const StorageOption option = stage.option(k);
      costs.saved[i].push_back(convert(option.saved_bytes));
      costs.forward_tmp[i].push_back(convert(option.forward_tmp_bytes));
      costs.backward_tmp[i].push_back(convert(option.backward_tmp_bytes));
      costs.forward_time[i].push_back(option.forward_time);
      costs.backward_time[i].push_back(option.backward_time);
    }
  }
  return costs;
}

// Memory needed (outside x_i, with δ_{l+1} held) by Fall_i with option k and by B_i
// afterwards: max(forward peak, backward peak). The sub-problem i+1..l comes on top.
int64_t forward_all_need(const std::vector<int64_t>& x,
                         const std::vector<std::vector<int64_t>>& saved_sizes,
                         const std::vector<std::vector<int64_t>>& forward_tmp,
                         const std::vector<std::vector<int64_t>>& backward_tmp, int i, int l,
                         int k) {
  const auto si = static_cast<size_t>(i);
  const auto sk = static_cast<size_t>(k);
  const int64_t saved = saved_sizes[si][sk];
  return std::max(x[static_cast<size_t>(l + 1)] + saved + forward_tmp[si][sk],
                  x[si + 1] + saved + x[si] + backward_tmp[si][sk]);
}

int64_t forward_all_need(const Costs& c, int i, int l, int k) {
  return forward_all_need(c.x, c.saved, c.forward_tmp, c.backward_tmp, i, l, k);
}

// Case (b), Fall_i kept while i+1..l are reversed, is always allowed unless `restricted`
// (OptimalOptions::forward_all_only_before_backward): then only for the stage's own reverse step
// (l == i), with the loss inside for the last stage.
bool forward_all_allowed(bool restricted, int length, int i, int l) {
  return !restricted || l == i || (i == length - 1 && l == length);
}

// Bytes of the min-max program's table and of the budgeted table (0 slots: the first alone).
double table_bytes(int stages, int slots) {
  const double n = static_cast<double>(stages) + 1;
  const double min_memory = n * n * 48;  // a MinMemory and a Cost per entry
  return min_memory + (slots > 0 ? n * (n + 1) / 2 * (slots + 1.0) * sizeof(double) : 0.0);
}

// Throws std::length_error before tables of more than options.max_table_bytes are allocated.
void check_table_size(const char* function, const Chain& chain, int slots,
                      const OptimalOptions& options) {
  const double bytes = table_bytes(chain.size(), slots);
  if (bytes <= static_cast<double>(options.max_table_bytes)) return;
  throw std::length_error(
      std::string(function) + ": planning " + std::to_string(chain.size()) + " stages" +
      (slots > 0 ? " with " + std::to_string(slots) + " slots" : std::string()) + " needs " +
      std::to_string(static_cast<int64_t>(bytes / 1e6)) +
      " MB of tables, above options.max_table_bytes (" +
      std::to_string(options.max_table_bytes / 1000000) +
      " MB). Use fewer slots, group stages into fewer, larger ones, or raise max_table_bytes.");
}

}  // namespace

// What a table entry does first: the loss (the chain is done), forward_all of its first stage
// (with a storage option), or forward_input and forward_none up to a later stage j.
enum class Step { Infeasible, Loss, ForwardAll, ForwardInput };

namespace {

// --- The min-max program: the smallest memory of any persistent schedule, exact. ---

struct MinMemory {
  int64_t memory = 0;
  double time = 0.0;
  Step step = Step::Loss;
  int option = 0;
  int j = 0;
};

class MinMemorySolver {
 public:
  MinMemorySolver(const Chain& chain, bool restricted)
      : c_(make_costs(chain, [](int64_t bytes) { return bytes; })),
        restricted_(restricted),
        n_(static_cast<size_t>(c_.length + 1)),
        table_(n_ * n_),
        by_end_(n_ * n_) {
    const int length = c_.length;
    for (int d = 0; d <= length; ++d) {
      for (int i = 0; i + d <= length; ++i) solve(i, i + d);
    }
  }

  int64_t memory() const { return at(0, c_.length).memory + c_.x[0]; }

  Schedule schedule() const {
    Schedule schedule;
    emit(0, c_.length, schedule.ops);
    return schedule;
  }

 private:
  const MinMemory& at(int i, int l) const {
    return table_[static_cast<size_t>(i) * n_ + static_cast<size_t>(l)];
  }

  static bool better(const MinMemory& a, const MinMemory& b) {
    return a.memory < b.memory || (a.memory == b.memory && a.time < b.time);
  }

  void solve(int i, int l) {
    MinMemory best;
    best.memory = std::numeric_limits<int64_t>::max();
    best.time = kInfinity;
    const int length = c_.length;
    if (i == length) {
      best = MinMemory{c_.x[static_cast<size_t>(length)], 0.0, Step::Loss, 0, 0};
    } else {
      const auto si = static_cast<size_t>(i);
      if (forward_all_allowed(restricted_, length, i, l)) {
        for (int k = 0; k < static_cast<int>(c_.saved[si].size()); ++k) {
          const auto sk = static_cast<size_t>(k);
          MinMemory candidate{forward_all_need(c_, i, l, k),
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
      double prefix = 0.0;
      int64_t forward = c_.x[si + 1] + c_.tmp[si];
      for (int j = i + 1; j <= l; ++j) {
        const auto sj = static_cast<size_t>(j);
        prefix += c_.time[sj - 1];
        if (j - 1 > i) forward = std::max(forward, c_.x[sj - 1] + c_.x[sj] + c_.tmp[sj - 1]);
        const Cost& right = by_end_[static_cast<size_t>(l) * n_ + sj];  // at(j, l), contiguous
        const MinMemory& left = at(i, j - 1);
        MinMemory candidate{std::max({c_.x[static_cast<size_t>(l + 1)] + forward,
                                      c_.x[sj] + right.memory, left.memory}),
                            prefix + right.time + left.time, Step::ForwardInput, 0, j};
        if (better(candidate, best)) best = candidate;
      }
    }
    table_[static_cast<size_t>(i) * n_ + static_cast<size_t>(l)] = best;
    by_end_[static_cast<size_t>(l) * n_ + static_cast<size_t>(i)] = {best.memory, best.time};
  }

  void emit(int i, int l, std::vector<Op>& ops) const {
    const MinMemory& choice = at(i, l);
    if (choice.step == Step::Loss) {
      ops.push_back({OpKind::Loss, c_.length, 0});
    } else if (choice.step == Step::ForwardAll) {
      ops.push_back({OpKind::ForwardAll, i, choice.option});
      if (l > i) emit(i + 1, l, ops);
      ops.push_back({OpKind::Backward, i, choice.option});
    } else {
      ops.push_back({OpKind::ForwardInput, i, 0});
      for (int k = i + 1; k < choice.j; ++k) ops.push_back({OpKind::ForwardNone, k, 0});
      emit(choice.j, l, ops);
      emit(i, choice.j - 1, ops);
    }
  }

  // The entries (j, l) of one l side by side: the split loop walks them by j.
  struct Cost {
    int64_t memory = 0;
    double time = 0.0;
  };

  Costs c_;
  bool restricted_;
  size_t n_;
  std::vector<MinMemory> table_;
  std::vector<Cost> by_end_;
};

}  // namespace

// --- The budgeted table ---

struct OptimalTable::Choice {
  Step step = Step::Infeasible;
  int option = 0;
  int j = 0;
};

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
  check_table_size("ckpt::plan::OptimalTable", chain_, options_.slots, options_);
  const MinMemorySolver min_memory(chain_, options_.forward_all_only_before_backward);
  min_feasible_budget_bytes_ = min_memory.memory();
  min_memory_schedule_ = min_memory.schedule();
  min_memory_time_ = 0.0;
  {
    // Same summation order as the simulator.
    for (const Op& op : min_memory_schedule_.ops) {
      const Stage* stage =
          op.stage < chain_.size() ? &chain_.stages[static_cast<size_t>(op.stage)] : nullptr;
      if (op.kind == OpKind::ForwardAll) min_memory_time_ += stage->option(op.option).forward_time;
      if (op.kind == OpKind::ForwardNone || op.kind == OpKind::ForwardInput) {
        min_memory_time_ += stage->forward_time;
      }
      if (op.kind == OpKind::Backward) min_memory_time_ += stage->option(op.option).backward_time;
    }
  }
  const Costs c = make_costs(chain_, [this](int64_t bytes) { return to_slots(bytes); });
  x_ = c.x;
  forward_tmp_ = c.tmp;
  saved_ = c.saved;
  option_forward_tmp_ = c.forward_tmp;
  option_backward_tmp_ = c.backward_tmp;
  build();
}

int64_t OptimalTable::to_slots(int64_t bytes) const {
  // ceil(bytes * slots / max_budget): a slot is max_budget / slots bytes, sizes rounded up.
  const Int128 scaled = static_cast<Int128>(bytes) * options_.slots;
  const Int128 result = (scaled + max_budget_bytes_ - 1) / max_budget_bytes_;
  return static_cast<int64_t>(std::min<Int128>(result, std::numeric_limits<int64_t>::max() / 4));
}

int64_t OptimalTable::available_slots(int64_t budget_bytes) const {
  // floor(budget * slots / max_budget): these slots hold at most budget_bytes.
  return static_cast<int64_t>(static_cast<Int128>(budget_bytes) * options_.slots /
                              max_budget_bytes_);
}

const double* OptimalTable::row(int i, int l) const {
  const auto length = static_cast<size_t>(chain_.size());
  const auto si = static_cast<size_t>(i);
  const size_t index =
      si * (length + 1) - si * (si - (si > 0 ? 1 : 0)) / 2 + static_cast<size_t>(l - i);
  return table_.data() + index * static_cast<size_t>(options_.slots + 1);
}

double* OptimalTable::row(int i, int l) {
  return const_cast<double*>(static_cast<const OptimalTable*>(this)->row(i, l));
}

void OptimalTable::build() {
  const int length = chain_.size();
  const int64_t slots = options_.slots;
  const bool restricted = options_.forward_all_only_before_backward;
  const auto rows = static_cast<size_t>(length + 1) * static_cast<size_t>(length + 2) / 2;
  table_.assign(rows * static_cast<size_t>(slots + 1), kInfinity);
  // first[row] = the smallest m with a finite entry (slots + 1 if none): every candidate that
  // reads a row below its first entry is infinite, so those m are skipped.
  std::vector<int64_t> first(rows, slots + 1);
  auto first_of = [&](int i, int l) -> int64_t& {
    const auto si = static_cast<size_t>(i);
    const auto n = static_cast<size_t>(length + 1);
    return first[si * n - si * (si - (si > 0 ? 1 : 0)) / 2 + static_cast<size_t>(l - i)];
  };

  // NOTE: iterate by interval length d = l - i: every read below is of a shorter interval, so
  // zero-slot sizes are safe (rotor's C loop order is not).
  for (int d = 0; d <= length; ++d) {
    for (int i = 0; i + d <= length; ++i) {
      const int l = i + d;
      double* __restrict out = row(i, l);
      if (i == length) {  // the loss: holds δ_L while x_L is held outside
        for (int64_t m = x_[static_cast<size_t>(length)]; m <= slots; ++m) out[m] = 0.0;
        first_of(i, l) = std::min<int64_t>(x_[static_cast<size_t>(length)], slots + 1);
        continue;
      }
      const Stage& stage = chain_.stages[static_cast<size_t>(i)];
      if (forward_all_allowed(restricted, length, i, l)) {
        for (int k = 0; k < stage.option_count(); ++k) {
          const StorageOption option = stage.option(k);
          const double cost = option.forward_time + option.backward_time;
          const int64_t need =
              forward_all_need(x_, saved_, option_forward_tmp_, option_backward_tmp_, i, l, k);
          if (l == i) {
            for (int64_t m = need; m <= slots; ++m) out[m] = std::min(out[m], cost);
          } else {
            const int64_t saved = saved_[static_cast<size_t>(i)][static_cast<size_t>(k)];
            const double* __restrict sub = row(i + 1, l);
            const int64_t start = std::max(need, first_of(i + 1, l) + saved);
            for (int64_t m = start; m <= slots; ++m) {
              out[m] = std::min(out[m], cost + sub[m - saved]);
            }
          }
        }
      }
      double prefix = 0.0;
      int64_t forward = x_[static_cast<size_t>(i + 1)] + forward_tmp_[static_cast<size_t>(i)];
      for (int j = i + 1; j <= l; ++j) {
        const auto sj = static_cast<size_t>(j);
        prefix += chain_.stages[sj - 1].forward_time;
        if (j - 1 > i) forward = std::max(forward, x_[sj - 1] + x_[sj] + forward_tmp_[sj - 1]);
        const int64_t need = std::max(x_[static_cast<size_t>(l + 1)] + forward, x_[sj]);
        const int64_t shift = x_[sj];
        const double* __restrict right = row(j, l);
        const double* __restrict left = row(i, j - 1);
        const int64_t start = std::max({need, first_of(j, l) + shift, first_of(i, j - 1)});
        for (int64_t m = start; m <= slots; ++m) {
          out[m] = std::min(out[m], (prefix + right[m - shift]) + left[m]);
        }
      }
      int64_t first_finite = 0;
      while (first_finite <= slots && !(out[first_finite] < kInfinity)) ++first_finite;
      first_of(i, l) = first_finite;
    }
  }
}

OptimalTable::Choice OptimalTable::best_choice(int i, int l, int64_t m) const {
  // Re-evaluates the candidates of build() for one m, in the same order and with the same
  // arithmetic, so the first minimum is the choice build() kept.
  Choice best;
  double best_time = kInfinity;
  const int length = chain_.size();
  if (i == length) {
    if (m >= x_[static_cast<size_t>(length)]) best.step = Step::Loss;
    return best;
  }
  const Stage& stage = chain_.stages[static_cast<size_t>(i)];
  if (forward_all_allowed(options_.forward_all_only_before_backward, length, i, l)) {
    for (int k = 0; k < stage.option_count(); ++k) {
      const StorageOption option = stage.option(k);
      const double cost = option.forward_time + option.backward_time;
      if (m < forward_all_need(x_, saved_, option_forward_tmp_, option_backward_tmp_, i, l, k))
        continue;
      double value = cost;
      if (l > i) {
        value = cost + row(i + 1, l)[m - saved_[static_cast<size_t>(i)][static_cast<size_t>(k)]];
      }
      if (value < best_time) {
        best_time = value;
        best = Choice{Step::ForwardAll, k, 0};
      }
    }
  }
  double prefix = 0.0;
  int64_t forward = x_[static_cast<size_t>(i + 1)] + forward_tmp_[static_cast<size_t>(i)];
  for (int j = i + 1; j <= l; ++j) {
    const auto sj = static_cast<size_t>(j);
    prefix += chain_.stages[sj - 1].forward_time;
    if (j - 1 > i) forward = std::max(forward, x_[sj - 1] + x_[sj] + forward_tmp_[sj - 1]);
    const int64_t need = std::max(x_[static_cast<size_t>(l + 1)] + forward, x_[sj]);
    if (m < need) continue;
    const double value = (prefix + row(j, l)[m - x_[sj]]) + row(i, j - 1)[m];
    if (value < best_time) {
      best_time = value;
      best = Choice{Step::ForwardInput, 0, j};
    }
  }
  return best;
}

void OptimalTable::reconstruct(int i, int l, int64_t m, std::vector<Op>& ops) const {
  const Choice choice = best_choice(i, l, m);
  if (choice.step == Step::Loss) {
    ops.push_back({OpKind::Loss, chain_.size(), 0});
  } else if (choice.step == Step::ForwardAll) {
    ops.push_back({OpKind::ForwardAll, i, choice.option});
    if (l > i) {
      reconstruct(i + 1, l, m - saved_[static_cast<size_t>(i)][static_cast<size_t>(choice.option)],
                  ops);
    }
    ops.push_back({OpKind::Backward, i, choice.option});
  } else if (choice.step == Step::ForwardInput) {
    ops.push_back({OpKind::ForwardInput, i, 0});
    for (int k = i + 1; k < choice.j; ++k) ops.push_back({OpKind::ForwardNone, k, 0});
    reconstruct(choice.j, l, m - x_[static_cast<size_t>(choice.j)], ops);
    reconstruct(i, choice.j - 1, m, ops);
  } else {
    throw std::logic_error(
        "ckpt::plan::OptimalTable: internal error, no choice for a finite entry");
  }
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
  const int64_t m = available_slots(budget_bytes) - x_[0];
  double best = m >= 0 ? row(0, chain_.size())[m] : kInfinity;
  if (budget_bytes >= min_feasible_budget_bytes_) best = std::min(best, min_memory_time_);
  return best;
}

std::optional<Schedule> OptimalTable::solve(int64_t budget_bytes) const {
  check_budget("ckpt::plan::OptimalTable::solve", budget_bytes);
  const int64_t m = available_slots(budget_bytes) - x_[0];
  const double table_time = m >= 0 ? row(0, chain_.size())[m] : kInfinity;
  if (budget_bytes >= min_feasible_budget_bytes_ && !(table_time <= min_memory_time_)) {
    return min_memory_schedule_;
  }
  if (table_time == kInfinity) return std::nullopt;
  Schedule schedule;
  schedule.ops.reserve(static_cast<size_t>(4 * chain_.size() + 1));
  reconstruct(0, chain_.size(), m, schedule.ops);
  return schedule;
}

std::optional<Schedule> solve_optimal(const Chain& chain, int64_t budget_bytes,
                                      const OptimalOptions& options) {
  chain.validate();
  if (budget_bytes < chain.input_bytes || budget_bytes < 1) {
    throw std::invalid_argument(
        "ckpt::plan::solve_optimal: budget_bytes must be at least the chain's input_bytes (" +
        std::to_string(chain.input_bytes) + ") and positive, but got " +
        std::to_string(budget_bytes) +
        ". The input is held for the whole step; pass a budget in bytes that includes it.");
  }
  if (chain.size() > options.max_exact_stages) {
    return solve_grouped(chain, budget_bytes, options.groups, options);
  }
  return OptimalTable(chain, budget_bytes, options).solve(budget_bytes);
}

int64_t optimal_table_bytes(int stages, const OptimalOptions& options) {
  const int table_stages = stages > options.max_exact_stages ? options.groups : stages;
  const double bytes = table_bytes(stages, 0) + table_bytes(table_stages, options.slots) -
                       table_bytes(table_stages, 0);
  return bytes < 9.2e18 ? static_cast<int64_t>(bytes) : std::numeric_limits<int64_t>::max();
}

int64_t min_feasible_budget_bytes(const Chain& chain, const OptimalOptions& options) {
  return detail::min_memory_plan("ckpt::plan::min_feasible_budget_bytes", chain, options).memory;
}

Schedule solve_min_memory(const Chain& chain, const OptimalOptions& options) {
  return detail::min_memory_plan("ckpt::plan::solve_min_memory", chain, options).schedule;
}

namespace detail {

MinMemoryPlan min_memory_plan(const char* function, const Chain& chain,
                              const OptimalOptions& options) {
  chain.validate();
  check_table_size(function, chain, 0, options);
  const MinMemorySolver solver(chain, options.forward_all_only_before_backward);
  return {solver.memory(), solver.schedule()};
}

}  // namespace detail

}  // namespace plan
}  // namespace ckpt
