// Branch and bound over the options of a ModelProblem: the fastest choice within the budgets, or
// the lowest peak within the host budget. docs/memory-model.md, "Any model".

#include <algorithm>
#include <numeric>
#include <vector>

#include "model_problem.h"

namespace ckpt {
namespace plan {
namespace detail {
namespace {

class Search {
 public:
  Search(const ModelProblem& problem, const ModelLimits& limits, bool by_peak, ModelBest& best)
      : problem_(problem),
        limits_(limits),
        by_peak_(by_peak),
        best_(best),
        loads_(problem.base),
        positions_(problem.candidates.size(), 0) {
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
    rest_extra_.assign(order_.size() + 1, 0.0);
    rest_host_.assign(order_.size() + 1, 0);
    for (size_t d = order_.size(); d-- > 0;) {
      const ModelCandidate& candidate = problem.candidates[order_[d]];
      rest_extra_[d] = rest_extra_[d + 1] + candidate.options[0].extra;
      rest_host_[d] = rest_host_[d + 1] + candidate.min_host;
      loads_.add(candidate.begin, candidate.min_delta, 1);
    }
  }

  // Whether the search finished within the node limit.
  bool run() {
    if (loads_.max() > limits_.budget || rest_host_[0] > limits_.host_budget) return true;
    visit(0);
    return !aborted_;
  }

 private:
  void visit(size_t depth) {
    if (++nodes_ > limits_.max_nodes) {
      aborted_ = true;
      return;
    }
    if (depth == order_.size()) {
      offer();
      return;
    }
    const int c = order_[depth];
    const ModelCandidate& candidate = problem_.candidates[c];
    for (size_t m = 0; m < candidate.options.size() && !aborted_; ++m) {
      const ModelOption& option = candidate.options[m];
      const double time = time_ + option.extra;
      // Options come by time: once one cannot beat the best, none after it can.
      if (!by_peak_ && best_.found && time + rest_extra_[depth + 1] > best_.time) break;
      const int64_t host = host_ + option.host;
      if (host + rest_host_[depth + 1] > limits_.host_budget) continue;
      loads_.add(candidate.begin, option.excess, 1);
      if (promising(time + rest_extra_[depth + 1])) {
        const double saved_time = time_;
        const int64_t saved_host = host_;
        time_ = time;
        host_ = host;
        positions_[c] = static_cast<int>(m);
        visit(depth + 1);
        time_ = saved_time;
        host_ = saved_host;
      }
      loads_.add(candidate.begin, option.excess, -1);
    }
  }

  // Whether a node whose completions take at least `time` and peak at least loads_.max() may
  // hold a better choice than the best.
  bool promising(double time) const {
    const int64_t peak = loads_.max();
    if (peak > limits_.budget) return false;
    if (!best_.found) return true;
    if (by_peak_) return peak < best_.peak;
    return time < best_.time || (time == best_.time && peak < best_.peak);
  }

  void offer() {
    const int64_t peak = loads_.max();
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

  const ModelProblem& problem_;
  const ModelLimits& limits_;
  const bool by_peak_;
  ModelBest& best_;
  SegmentLoads loads_;
  std::vector<int> positions_;
  std::vector<int> order_;
  std::vector<double> rest_extra_;  // the fewest seconds the candidates from a depth on add
  std::vector<int64_t> rest_host_;  // the fewest host bytes they hold
  double time_ = 0.0;
  int64_t host_ = 0;
  int64_t nodes_ = 0;
  bool aborted_ = false;
};

}  // namespace

bool search_fastest(const ModelProblem& problem, const ModelLimits& limits, ModelBest& incumbent) {
  return Search(problem, limits, /*by_peak=*/false, incumbent).run();
}

bool search_lowest_peak(const ModelProblem& problem, const ModelLimits& limits,
                        ModelBest& incumbent) {
  return Search(problem, limits, /*by_peak=*/true, incumbent).run();
}

}  // namespace detail
}  // namespace plan
}  // namespace ckpt
