// Branch and bound over the options of a ModelProblem: the fastest choice within the budgets, or
// the lowest peak within the host budget. docs/memory-model.md, "Any model".

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <utility>
#include <vector>

#include "model_bound.h"
#include "model_problem.h"

namespace ckpt {
namespace plan {
namespace detail {
namespace {

constexpr size_t kCriticalSegments = 2;

// What the decided options exclude: per option, how many decided options exclude it; per
// undecided candidate, whether it has options left and, with segment weights, its least weighted
// delta over them (a tighter bound than over all of its options).
class Excluded {
 public:
  Excluded(const ModelProblem& problem, const std::vector<int>& order,
           const SeparableBound* weights)
      : weights_(weights), rank_(order.size()), dead_(order.size(), 0) {
    for (size_t d = 0; d < order.size(); ++d) rank_[order[d]] = d;
    for (const ModelCandidate& candidate : problem.candidates) {
      count_.emplace_back(candidate.options.size(), 0);
    }
    for (size_t c = 0; weights && c < order.size(); ++c) least_.push_back(weights->least(c));
  }

  bool blocked(int c, int position) const { return count_[c][position] > 0; }
  // Whether an undecided candidate has every option excluded: no completion is valid.
  bool dead() const { return dead_count_ > 0; }
  double least(int c) const { return least_[c]; }

  // Counts the exclusions of `option` (sign 1, as it is decided at `depth`) or uncounts them
  // (sign -1), rescoring the undecided candidates whose options that closes or opens. Returns
  // how much their least weighted deltas rose.
  double block(const ModelOption& option, int sign, size_t depth) {
    double rise = 0.0;
    for (const auto& [d, p] : option.excludes) {
      const bool was = count_[d][p] > 0;
      count_[d][p] += sign;
      if (rank_[d] > depth && was != (count_[d][p] > 0)) rise += rescore(d);
    }
    return rise;
  }

 private:
  double rescore(int d) {
    double least = std::numeric_limits<double>::infinity();
    bool open = false;
    for (size_t p = 0; p < count_[d].size(); ++p) {
      if (count_[d][p] > 0) continue;
      open = true;
      if (weights_) least = std::min(least, weights_->option(d, static_cast<int>(p)));
    }
    dead_count_ += (open ? 0 : 1) - dead_[d];
    dead_[d] = open ? 0 : 1;
    if (!open || !weights_) return 0.0;  // a dead candidate keeps its last score: its node is cut
    const double rise = least - least_[d];
    least_[d] = least;
    return rise;
  }

  const SeparableBound* weights_;
  std::vector<size_t> rank_;  // per candidate: its depth in the order (to tell the decided)
  std::vector<std::vector<int>> count_;
  std::vector<int> dead_;
  int dead_count_ = 0;
  std::vector<double> least_;  // with weights
};

class Search {
 public:
  Search(const ModelProblem& problem, const ModelLimits& limits, bool by_peak, ModelBest& best)
      : problem_(problem),
        limits_(limits),
        by_peak_(by_peak),
        best_(best),
        loads_(problem.base),
        fast_(problem.base.size(), 0),
        positions_(problem.candidates.size(), 0),
        children_(problem.candidates.size()) {
    // Forward order, outer windows first: the windows that cover most segments decide first.
    order_.resize(problem.candidates.size());
    std::iota(order_.begin(), order_.end(), 0);
    std::stable_sort(order_.begin(), order_.end(), [&](int a, int b) {
      const ModelCandidate& x = problem.candidates[a];
      const ModelCandidate& y = problem.candidates[b];
      return x.begin < y.begin || (x.begin == y.begin && x.length > y.length);
    });
    // Until a candidate is decided its smallest delta, time and host stand in for it: the loads
    // are lower bounds of every completion's, and only rise as candidates are decided.
    // And their fastest options would add `fast_` on top: past the budget, that costs at least
    // the overflow times the fewest seconds per byte saved among them (`rest_rate_`).
    rest_extra_.assign(order_.size() + 1, 0.0);
    rest_host_.assign(order_.size() + 1, 0);
    rest_rate_.assign(order_.size() + 1, std::numeric_limits<double>::infinity());
    for (size_t d = order_.size(); d-- > 0;) {
      const ModelCandidate& candidate = problem.candidates[order_[d]];
      rest_extra_[d] = rest_extra_[d + 1] + candidate.options[0].extra;
      rest_host_[d] = rest_host_[d + 1] + candidate.min_host;
      rest_rate_[d] = std::min(rest_rate_[d + 1], candidate.rate);
      add(loads_, candidate.begin, candidate.min_delta, 1);
      add(fast_, candidate.begin, candidate.options[0].excess, 1);
    }
    if (!by_peak) critical_bounds();
    if (by_peak && !order_.empty()) weights_ = std::make_unique<PeakWeights>(problem);
    if (!by_peak && !order_.empty() && best_.found) {
      weights_ = std::make_unique<TimeMultipliers>(problem, limits.budget, best_.time);
    }
    if (weights_) weighted_ = weights_->bound();
    if (problem.has_exclusions)
      excluded_ = std::make_unique<Excluded>(problem, order_, weights_.get());
  }

  // The knapsack bounds of the segments that overflow the budget most with every candidate at
  // its fastest option: where a step's peak is decided.
  void critical_bounds() {
    std::vector<std::pair<int64_t, int>> overflow;
    for (size_t k = 0; k < loads_.size(); ++k) {
      const int64_t load = loads_[k] + fast_[k];
      if (load > limits_.budget) overflow.emplace_back(load, static_cast<int>(k));
    }
    const size_t count = std::min(overflow.size(), kCriticalSegments);
    std::partial_sort(overflow.begin(), overflow.begin() + count, overflow.end(), std::greater<>());
    for (size_t i = 0; i < count; ++i) bounds_.emplace_back(problem_, overflow[i].second);
    decided_.assign(problem_.candidates.size(), 0);
  }

  SearchOutcome run() {
    const int64_t peak = loads_.empty() ? 0 : *std::max_element(loads_.begin(), loads_.end());
    if (peak > limits_.budget || rest_host_[0] > limits_.host_budget) return {true, root_bound_};
    visit(0, peak);
    return {!aborted_, root_bound_};
  }

 private:
  // A decided option, with the peak of the loads once it is added and the fewest seconds (over
  // the plain step) of its completions.
  struct Child {
    int64_t peak = 0;
    int64_t least_peak = 0;  // the lowest peak of its completions, as far as the bounds tell
    double time = 0.0;
    int position = 0;
  };

  // `peak`: the largest of loads_. Loads only rise down the tree, so a child's peak is the
  // larger of `peak` and its own window's: O(window) per child.
  void visit(size_t depth, int64_t peak) {
    if (++nodes_ > limits_.max_nodes) {
      aborted_ = true;
      return;
    }
    if (depth == order_.size()) {
      offer(peak);
      return;
    }
    const int c = order_[depth];
    const ModelCandidate& candidate = problem_.candidates[c];
    std::vector<Child>& children = children_[depth];
    expand(depth, peak, children);
    if (!decided_.empty()) decided_[c] = 1;
    for (const Child& child : children) {
      if (aborted_) return;
      const ModelOption& option = candidate.options[child.position];
      if (!promising(child.time, child.least_peak)) continue;  // the best improved since
      add(loads_, candidate.begin, option.excess, 1);
      add(fast_, candidate.begin, candidate.options[0].excess, -1);
      const double time = time_;  // restored exactly: (t + x) - x may differ from t
      time_ += option.extra;
      host_ += option.host;
      positions_[c] = child.position;
      const double weighted = weighted_;
      if (weights_) weighted_ += weights_->option(c, child.position) - least(c);
      if (excluded_) weighted_ += excluded_->block(option, 1, depth);
      if (!excluded_ || !excluded_->dead()) visit(depth + 1, child.peak);
      if (excluded_) excluded_->block(option, -1, depth);  // weighted_ is put back below
      weighted_ = weighted;
      time_ = time;
      host_ -= option.host;
      add(fast_, candidate.begin, candidate.options[0].excess, 1);
      add(loads_, candidate.begin, option.excess, -1);
    }
    if (!decided_.empty()) decided_[c] = 0;
  }

  // The promising options of the candidate at `depth`: by time, or by peak when by_peak_.
  void expand(size_t depth, int64_t peak, std::vector<Child>& children) {
    const int c = order_[depth];
    const ModelCandidate& candidate = problem_.candidates[c];
    children.clear();
    if (!decided_.empty()) {
      decided_[c] = 1;
      for (SegmentBound& bound : bounds_) bound.restrict(decided_);
    }
    for (size_t m = 0; m < candidate.options.size(); ++m) {
      const ModelOption& option = candidate.options[m];
      // Options come by time: once one cannot beat the best, none after it can.
      const double least_time = time_ + option.extra + rest_extra_[depth + 1];
      if (!by_peak_ && best_.found && least_time > time_to_beat()) {
        if (depth == 0) root_bound_ = std::min(root_bound_, least_time);
        break;
      }
      if (excluded_ && excluded_->blocked(c, static_cast<int>(m))) continue;
      if (host_ + option.host + rest_host_[depth + 1] > limits_.host_budget) continue;
      int64_t highest = peak, fastest = 0;
      if (!scan(candidate, option, highest, fastest)) continue;
      // The bounds' rounding must not prune a completion of equal time (ties go to the peak).
      const double time =
          by_peak_ ? 0.0
                   : std::max(least_time + std::max(recompute_cost(fastest, rest_rate_[depth + 1]),
                                                    knapsack(option, c)) *
                                               (1.0 - 1e-9),
                              separable(c, static_cast<int>(m)));
      const int64_t least =
          by_peak_ ? std::max(highest, weighted_bound(c, static_cast<int>(m))) : highest;
      if (depth == 0) root_bound_ = std::min(root_bound_, by_peak_ ? least : time);
      if (promising(time, least))
        children.push_back(Child{highest, least, time, static_cast<int>(m)});
    }
    if (by_peak_) {
      std::stable_sort(children.begin(), children.end(),
                       [](const Child& a, const Child& b) { return a.least_peak < b.least_peak; });
    }
  }

  // Whether a node whose completions take at least `time` and peak at least `peak` may hold a
  // better choice than the best.
  bool promising(double time, int64_t peak) const {
    if (peak > limits_.budget) return false;
    if (!best_.found) return true;
    if (by_peak_) return peak < best_.peak;
    if (limits_.gap > 0.0) return time < time_to_beat();
    return time < best_.time || (time == best_.time && peak < best_.peak);
  }

  // The extra seconds a completion must stay below to beat the best by more than the gap.
  double time_to_beat() const {
    if (limits_.gap == 0.0) return best_.time;
    return (problem_.step_time + best_.time) / (1.0 + limits_.gap) - problem_.step_time;
  }

  void offer(int64_t peak) {
    if (by_peak_) {
      if (!best_.found || peak < best_.peak || (peak == best_.peak && time_ < best_.time)) {
        best_.found = true;
        best_.time = time_;
        best_.peak = peak;
        best_.positions = positions_;
      }
      return;
    }
    best_.offer(time_, peak, positions_);
  }

  // The peak once `option` is added (`highest`, which starts at the peak before), and the peak
  // were the undecided at their fastest options (`fastest`). False as soon as a segment shows
  // the option can't beat the best or fit the budget.
  bool scan(const ModelCandidate& candidate, const ModelOption& option, int64_t& highest,
            int64_t& fastest) const {
    const int64_t cutoff = by_peak_ && best_.found ? best_.peak - 1 : limits_.budget;
    if (highest > cutoff) return false;
    const int64_t* loads = loads_.data() + candidate.begin;
    if (by_peak_) {  // no fastest
      for (int i = 0; i < candidate.length; ++i) {
        const int64_t load = loads[i] + option.excess[i];
        if (load > cutoff) return false;
        highest = std::max(highest, load);
      }
      return true;
    }
    fastest = std::numeric_limits<int64_t>::min();
    const int64_t* fast = fast_.data() + candidate.begin;
    const int64_t* own = candidate.options[0].excess.data();
    for (int i = 0; i < candidate.length; ++i) {
      const int64_t load = loads[i] + option.excess[i];
      if (load > cutoff) return false;
      highest = std::max(highest, load);
      fastest = std::max(fastest, load + fast[i] - own[i]);
    }
    return true;
  }

  // The separable bound (the lowest peak the segment weights allow, or the fewest extra seconds
  // the multipliers allow) once candidate c takes `position`, less a margin for its rounding;
  // the lowest double without one.
  double separable(int c, int position) const {
    if (!weights_) return std::numeric_limits<double>::lowest();
    return weighted_ + weights_->option(c, position) - least(c) - weights_->slack();
  }
  int64_t weighted_bound(int c, int position) const {
    if (!weights_) return std::numeric_limits<int64_t>::min();
    return static_cast<int64_t>(std::ceil(separable(c, position) - 1e-6));
  }

  // The largest knapsack bound once candidate c takes `option`.
  double knapsack(const ModelOption& option, int c) const {
    const ModelCandidate& candidate = problem_.candidates[c];
    double most = 0.0;
    for (const SegmentBound& bound : bounds_) {
      const int k = bound.segment();
      int64_t load = loads_[k] + fast_[k];
      const int i = k - candidate.begin;
      if (i >= 0 && i < candidate.length) load += option.excess[i] - candidate.options[0].excess[i];
      most = std::max(most, bound.cost(load - limits_.budget));
    }
    return most;
  }

  // The fewest seconds the undecided candidates spend to bring a segment whose load would be
  // `load` with each at its fastest option within the budget, at `rate` seconds per byte.
  double recompute_cost(int64_t load, double rate) const {
    if (load <= limits_.budget) return 0.0;
    return rate * (static_cast<double>(load) - static_cast<double>(limits_.budget));
  }

  // Candidate c's least weighted delta: over the options it has left, where exclusions are.
  double least(int c) const { return excluded_ ? excluded_->least(c) : weights_->least(c); }

  static void add(std::vector<int64_t>& to, int begin, const std::vector<int64_t>& values,
                  int sign) {
    for (size_t i = 0; i < values.size(); ++i) to[begin + i] += sign * values[i];
  }

  const ModelProblem& problem_;
  const ModelLimits& limits_;
  const bool by_peak_;
  ModelBest& best_;
  std::vector<int64_t> loads_;  // each segment's, the undecided at their smallest deltas
  std::vector<int64_t> fast_;   // what the undecided's fastest options add to loads_
  std::vector<int> positions_;
  std::vector<std::vector<Child>> children_;  // per depth, reused
  std::vector<int> order_;
  std::vector<double> rest_extra_;    // the fewest seconds the candidates from a depth on add
  std::vector<int64_t> rest_host_;    // the fewest host bytes they hold
  std::vector<double> rest_rate_;     // the fewest seconds per byte saved among them
  std::vector<SegmentBound> bounds_;  // of the critical segments (time only)
  std::vector<char> decided_;         // per candidate, while bounds_ are kept
  std::unique_ptr<SeparableBound> weights_;  // PeakWeights, or TimeMultipliers (with a best)
  double weighted_ = 0.0;                    // that bound with the decided candidates as decided
  double time_ = 0.0;
  int64_t host_ = 0;
  int64_t nodes_ = 0;
  bool aborted_ = false;
  double root_bound_ = std::numeric_limits<double>::infinity();  // the root's least child bound
  std::unique_ptr<Excluded> excluded_;                           // where the profile has exclusions
};

}  // namespace

SearchOutcome search_fastest(const ModelProblem& problem, const ModelLimits& limits,
                             ModelBest& incumbent) {
  return Search(problem, limits, /*by_peak=*/false, incumbent).run();
}

SearchOutcome search_lowest_peak(const ModelProblem& problem, const ModelLimits& limits,
                                 ModelBest& incumbent) {
  return Search(problem, limits, /*by_peak=*/true, incumbent).run();
}

}  // namespace detail
}  // namespace plan
}  // namespace ckpt
