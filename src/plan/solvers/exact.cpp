// rotor's dynamic program in exact bytes: each entry Opt(i, l, ·) is a nonincreasing step function
// of the memory, kept as its steps. docs/memory-model.md, "Exact in bytes".

#include <algorithm>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/plan/solvers.h"
#include "dp_terms.h"
#include "intervals.h"
#include "min_memory.h"
#include "pareto.h"

namespace ckpt {
namespace plan {
namespace {

using detail::Choice;
using detail::Costs;
using detail::Step;

constexpr double kInfinity = std::numeric_limits<double>::infinity();

// Opt(i, l, m) = time for m in [memory, next step's memory); +infinity below the first step.
struct Breakpoint {
  int64_t memory = 0;
  double time = 0.0;
};

class ExactProgram {
 public:
  // `host`: the host memory every option may use, detail::kUnlimitedHost, or 0 for none (the
  // program has no host resource: pareto.h's has).
  ExactProgram(const Chain& chain, int64_t memory, int64_t host, bool restricted, int64_t max_work,
               detail::Intervals intervals, size_t max_steps = std::numeric_limits<size_t>::max())
      : c_(detail::byte_costs(chain)),
        memory_(memory),
        host_(host),
        restricted_(restricted),
        max_work_(max_work),
        max_steps_(max_steps),
        intervals_(std::move(intervals)),
        spans_(intervals_.entries()),
        spans_by_start_(intervals_.entries()),
        prefix_(static_cast<size_t>(c_.length) + 1),
        forward_(static_cast<size_t>(c_.length) + 1) {
    // Every entry reads entries of shorter intervals: (i + 1, l), (j, l) and (i, j - 1).
    for (int i = c_.length; i >= 0 && completed_; --i) {
      fill_forward_input_prefixes(c_, i, prefix_, forward_);
      for (int l = i; l <= c_.length && completed_; l = intervals_.next_end(i, l)) build(i, l);
    }
  }

  bool completed() const { return completed_; }
  int64_t work() const { return work_; }
  bool feasible() const { return value(0, c_.length, memory_) < kInfinity; }

  Schedule schedule() const {
    Schedule schedule;
    detail::emit_ops(
        c_, 0, c_.length, memory_, host_,
        [this](int i, int l, int64_t m, int64_t h) { return choose(i, l, m, h); }, schedule.ops);
    return schedule;
  }

 private:
  // Where an entry's steps lie in pool_, and the memory of its first step (none: INT64_MAX), kept
  // twice: by end, and by start for case (a)'s walk of (i, j - 1) by j.
  struct Span {
    size_t begin = 0, end = 0;
    int64_t first = std::numeric_limits<int64_t>::max();
  };

  const Breakpoint* first(int i, int l) const {
    return pool_.data() + spans_[intervals_.index(i, l)].begin;
  }
  const Breakpoint* last(int i, int l) const {
    return pool_.data() + spans_[intervals_.index(i, l)].end;
  }

  double value(int i, int l, int64_t m) const {
    const Breakpoint* found = std::upper_bound(
        first(i, l), last(i, l), m, [](int64_t at, const Breakpoint& p) { return at < p.memory; });
    return found == first(i, l) ? kInfinity : (found - 1)->time;
  }

  void build(int i, int l) {
    envelope_.clear();
    if (i == c_.length) {
      if (c_.x_at(i) <= memory_) envelope_.push_back({c_.x_at(i), 0.0});
    } else {
      if (detail::forward_all_allowed(restricted_, c_.length, i, l)) {
        for (int k = 0; k < c_.options(i); ++k) {
          if (c_.host_at(i, k) <= host_) add_forward_all(i, l, k);
        }
      }
      for (int j = intervals_.next_split(i, l, i + 1); j <= l;
           j = intervals_.next_split(i, l, j + 1)) {
        const auto sj = static_cast<size_t>(j);
        const int64_t need = std::max(c_.x[static_cast<size_t>(l) + 1] + forward_[sj], c_.x[sj]) +
                             c_.gradients_from(l + 1);
        add_forward_input(i, j, l, prefix_[sj], need);
      }
    }
    if (work_ > max_work_) completed_ = false;
    // A truncated entry answers every larger memory with its last step's time: still the time
    // of a schedule that fits.
    if (envelope_.size() > max_steps_) envelope_.resize(max_steps_);
    Span span{pool_.size(), pool_.size() + envelope_.size(), std::numeric_limits<int64_t>::max()};
    if (!envelope_.empty()) span.first = envelope_.front().memory;
    pool_.insert(pool_.end(), envelope_.begin(), envelope_.end());
    spans_[intervals_.index(i, l)] = span;
    spans_by_start_[intervals_.index_by_start(i, l)] = span;
  }

  // Case (b): Fall_i^k, then i+1..l in m - s^k, then B_i^k.
  void add_forward_all(int i, int l, int k) {
    const double cost = c_.forward_backward_time(i, k);
    const int64_t need = c_.forward_all_need(i, l, k);
    if (need > memory_) return;
    candidate_.clear();
    if (l == i) {
      candidate_.push_back({need, cost});
    } else {
      const int64_t kept = c_.saved_at(i, k);
      const double at_need = cost + value(i + 1, l, need - kept);
      if (at_need < kInfinity) candidate_.push_back({need, at_need});
      for (const Breakpoint* p = first(i + 1, l); p != last(i + 1, l); ++p) {
        const int64_t m = p->memory + kept;
        if (m > memory_) break;
        if (m > need) candidate_.push_back({m, cost + p->time});
      }
    }
    merge_candidate();
  }

  // Case (a): Fck_i Fn_{i+1..j-1}, then j..l in m - x_j, then i..j-1 in m.
  void add_forward_input(int i, int j, int l, double prefix, int64_t need) {
    const int64_t shift = c_.x_at(j);
    if (need > memory_) return;
    const Span& right_span = spans_[intervals_.index(j, l)];
    const Span& left_span = spans_by_start_[intervals_.index_by_start(i, j - 1)];
    if (right_span.first > memory_ - shift || left_span.first > memory_) return;  // none, or above
    const Breakpoint *right = pool_.data() + right_span.begin,
                     *right_end = pool_.data() + right_span.end;
    const Breakpoint *left = pool_.data() + left_span.begin,
                     *left_end = pool_.data() + left_span.end;
    int64_t m = std::max({need, right->memory + shift, left->memory});
    // The steps at or below m give the values at m.
    while (right + 1 != right_end && (right + 1)->memory + shift <= m) ++right;
    while (left + 1 != left_end && (left + 1)->memory <= m) ++left;
    candidate_.clear();
    const Breakpoint* kept = envelope_.data();
    const Breakpoint* const kept_end = kept + envelope_.size();
    for (;; ++work_) {
      // Only the points below the envelope so far can change it.
      while (kept != kept_end && kept->memory <= m) ++kept;
      const double time = (prefix + right->time) + left->time;
      if (kept == envelope_.data() || time < (kept - 1)->time) candidate_.push_back({m, time});
      const int64_t next_right = right + 1 != right_end ? (right + 1)->memory + shift
                                                        : std::numeric_limits<int64_t>::max();
      const int64_t next_left =
          left + 1 != left_end ? left[1].memory : std::numeric_limits<int64_t>::max();
      m = std::min(next_right, next_left);
      if (m > memory_) break;
      if (next_right == m) ++right;
      if (next_left == m) ++left;
    }
    if (!candidate_.empty()) merge_candidate();
  }

  // envelope_ = the lower envelope of envelope_ and candidate_ (both sorted by memory).
  void merge_candidate() {
    work_ += static_cast<int64_t>(envelope_.size() + candidate_.size());
    merged_.clear();
    double best = kInfinity;
    size_t a = 0, b = 0;
    while (a < envelope_.size() || b < candidate_.size()) {
      const bool take_a = b == candidate_.size() ||
                          (a < envelope_.size() && envelope_[a].memory <= candidate_[b].memory);
      const Breakpoint p = take_a ? envelope_[a++] : candidate_[b++];
      if (p.time < best) {
        if (!merged_.empty() && merged_.back().memory == p.memory) merged_.pop_back();
        merged_.push_back(p);
        best = p.time;
      }
    }
    envelope_.swap(merged_);
  }

  Choice choose(int i, int l, int64_t m, int64_t h) const {
    return detail::best_choice(
        c_, restricted_, i, l, m, h,
        [this](int a, int b, int64_t at, int64_t) { return value(a, b, at); },
        [&](int j) { return intervals_.splits_at(i, l, j); });
  }

  Costs c_;
  int64_t memory_;
  int64_t host_;
  bool restricted_;
  int64_t max_work_;
  size_t max_steps_;
  detail::Intervals intervals_;
  bool completed_ = true;
  int64_t work_ = 0;
  std::vector<Breakpoint> pool_;  // every entry's steps
  std::vector<Span> spans_, spans_by_start_;
  std::vector<double> prefix_;  // fill_forward_input_prefixes
  std::vector<int64_t> forward_;
  std::vector<Breakpoint> envelope_, candidate_, merged_;  // scratch of build()
};

}  // namespace

namespace {

// solve_exact where the host budget can bind: the Pareto program over (device, host).
ExactSolution solve_pareto(const Chain& chain, int64_t memory, int64_t max_work,
                           const OptimalOptions& options) {
  ExactSolution solution;
  const detail::ParetoProgram program(chain, memory, options.host_budget_bytes,
                                      options.forward_all_only_before_backward, max_work);
  solution.work = program.work();
  if (!program.completed()) {
    solution.status = ExactSolution::Status::OverWorkLimit;
  } else if (program.value(0, chain.size(), memory, options.host_budget_bytes) < kInfinity) {
    solution.status = ExactSolution::Status::Solved;
    solution.schedule = program.schedule(memory, options.host_budget_bytes);
  }
  return solution;
}

}  // namespace

ExactSolution solve_exact(const Chain& chain, int64_t budget_bytes, int64_t max_work,
                          const OptimalOptions& options) {
  chain.validate();
  detail::check_host_budget("ckpt::plan::solve_exact", options);
  ExactSolution solution;
  const int64_t memory = budget_bytes - chain.input_bytes;
  if (memory < 0) return solution;
  // Every pair of an entry and a checkpoint costs a step or more: more pairs than max_work
  // cannot finish (and an O(L^3) loop of infeasible pairs would be uncounted).
  if (detail::Intervals::dense_pairs(chain.size()) > max_work) {
    solution.status = ExactSolution::Status::OverWorkLimit;
    return solution;
  }
  if (detail::host_binds(chain, options)) return solve_pareto(chain, memory, max_work, options);
  const ExactProgram program(chain, memory, detail::kUnlimitedHost,
                             options.forward_all_only_before_backward, max_work,
                             detail::Intervals::dense(chain.size()));
  solution.work = program.work();
  if (!program.completed()) {
    solution.status = ExactSolution::Status::OverWorkLimit;
  } else if (program.feasible()) {
    solution.status = ExactSolution::Status::Solved;
    solution.schedule = program.schedule();
  }
  return solution;
}

std::optional<Schedule> solve_truncated(const Chain& chain, int64_t budget_bytes, int steps,
                                        const OptimalOptions& options) {
  chain.validate();
  detail::check_host_budget("ckpt::plan::solve_truncated", options);
  if (steps < 1) {
    throw std::invalid_argument("ckpt::plan::solve_truncated: steps must be at least 1, but got " +
                                std::to_string(steps) + ".");
  }
  const int64_t memory = budget_bytes - chain.input_bytes;
  if (memory < 0) return std::nullopt;
  const detail::ProgramLimits limits = detail::truncated_limits(options, steps);
  detail::check_table_size("ckpt::plan::solve_truncated", chain.size(), 0, options, limits);
  std::vector<int64_t> x(static_cast<size_t>(chain.size()) + 2, 0);
  for (int i = 0; i <= chain.size(); ++i) x[static_cast<size_t>(i)] = chain.activation_bytes(i);
  // No host resource here: where the host budget can bind, no option offloads.
  const int64_t host = detail::host_binds(chain, options) ? 0 : detail::kUnlimitedHost;
  const ExactProgram program(chain, memory, host, options.forward_all_only_before_backward,
                             std::numeric_limits<int64_t>::max(), detail::intervals_for(x, limits),
                             static_cast<size_t>(steps));
  if (!program.feasible()) return std::nullopt;
  return program.schedule();
}

}  // namespace plan
}  // namespace ckpt
