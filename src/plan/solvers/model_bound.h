#pragma once

// A lower bound for the model's branch and bound: at one segment, the fewest seconds the
// undecided candidates must spend to take an overflow off it, from the relaxation of the
// multiple-choice knapsack (each candidate may mix its options fractionally).

#include <cstdint>
#include <vector>

#include "model_problem.h"

namespace ckpt {
namespace plan {
namespace detail {

class SegmentBound {
 public:
  SegmentBound(const ModelProblem& problem, int segment);
  int segment() const { return segment_; }
  // Prepares cost() for the candidates not `decided` (one flag per candidate).
  void restrict(const std::vector<char>& decided);
  // The fewest seconds over their fastest options that take `overflow` bytes off the segment
  // (0 when it is not positive; infinity when they cannot).
  double cost(int64_t overflow) const;

 private:
  // One edge of a candidate's lower convex hull of (bytes saved, seconds) over its options.
  struct Step {
    double slope = 0.0;
    int64_t bytes = 0;
    int candidate = 0;
  };
  int segment_;
  std::vector<Step> steps_;      // by slope
  std::vector<int64_t> bytes_;   // restricted: bytes saved by the first steps, cumulated
  std::vector<double> seconds_;  // and their seconds
};

// Weights on the segments for a bound of the lowest peak: for weights w >= 0 that sum to 1, no
// choice peaks below sum_k w_k P_k + sum_c min_m (w . d_{c,m}), as the peak is at least the
// weighted mean of the loads. The weights come from multiplicative weights (the peak's
// Lagrangian relaxation, approached in kWeightRounds best responses).
class PeakWeights {
 public:
  explicit PeakWeights(const ModelProblem& problem);
  // The bound with every candidate undecided.
  double bound() const { return bound_; }
  // w . d of candidate c's option at `position`, and the least of those over its options.
  double option(int c, int position) const { return option_[c][position]; }
  double least(int c) const { return least_[c]; }
  // Each candidate's position of least w . d under the bound's weights: a start for heuristics.
  const std::vector<int>& response() const { return response_; }

 private:
  // The bound under `weights`, with each candidate's best response's deltas added to `loads`.
  double evaluate(const std::vector<double>& weights, std::vector<int64_t>& loads);
  const ModelProblem& problem_;
  double bound_ = 0.0;
  std::vector<std::vector<double>> option_;
  std::vector<double> least_;
  std::vector<int> response_;
};

}  // namespace detail
}  // namespace plan
}  // namespace ckpt
