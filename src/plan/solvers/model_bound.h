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

// A bound that separates over the candidates: `bound()` with every candidate undecided, each
// candidate adding its least term; deciding candidate c at `position` adds option(c, position)
// less least(c) to it (a search keeps it up to date in O(1) per decision).
class SeparableBound {
 public:
  // Searches hold either bound through this base (a unique_ptr deletes through it).
  virtual ~SeparableBound() = default;
  double bound() const { return bound_; }
  double option(int c, int position) const { return option_[c][position]; }
  double least(int c) const { return least_[c]; }
  // What rounding may take off the bound: searches cut only below bound() - slack().
  double slack() const { return slack_; }

 protected:
  explicit SeparableBound(const ModelProblem& problem);
  // The bound with constant term `constant` and candidate c's option m costing term(c, m),
  // each candidate at its least term (`response_`) and that term's deltas added to `loads`
  // (which start at the plain peaks).
  template <typename Term>
  double evaluate(double constant, Term term, std::vector<int64_t>& loads);
  const ModelProblem& problem_;
  double bound_ = 0.0;
  double slack_ = 0.0;
  std::vector<std::vector<double>> option_;
  std::vector<double> least_;
  std::vector<int> response_;
};

// Weights on the segments for a bound of the lowest peak: for weights w >= 0 that sum to 1, no
// choice peaks below sum_k w_k P_k + sum_c min_m (w . d_{c,m}), as the peak is at least the
// weighted mean of the loads. The weights come from multiplicative weights (the peak's
// Lagrangian relaxation, approached in kWeightRounds best responses).
class PeakWeights : public SeparableBound {
 public:
  explicit PeakWeights(const ModelProblem& problem);
  // Each candidate's position of least w . d under the bound's weights: a start for heuristics.
  const std::vector<int>& response() const { return response_; }

 private:
  double evaluate(const std::vector<double>& weights, std::vector<int64_t>& loads);
};

// Multipliers for a bound of the fastest choice within budget B: for multipliers l >= 0 on the
// segments and u >= 0 on the pairs of options that exclude each other, no valid choice that
// fits takes fewer extra seconds than
//   sum_k l_k (P_k - B) / B - sum_pairs u + sum_c min_m (x_{c,m} + l . d_{c,m} / B + u of the
//   pairs (c, m) is in),
// as each l_k (load_k - B) is at most 0 where it fits and each pair holds at most one chosen
// option (the Lagrangian relaxation of the budget and the exclusions). The multipliers come from
// subgradient steps toward `target` (seconds of a choice that fits: Polyak's step size).
class TimeMultipliers : public SeparableBound {
 public:
  TimeMultipliers(const ModelProblem& problem, int64_t budget, double target);

 private:
  struct Pair {
    int c, m, d, q;  // candidate c's option m excludes candidate d's option q (positions)
  };
  double evaluate(const std::vector<double>& multipliers, std::vector<int64_t>& loads);
  // The subgradient at the best responses: each segment's overflow / B, then each pair's
  // chosen options less 1.
  void subgradient(const std::vector<int64_t>& loads, std::vector<double>& slopes) const;
  int64_t budget_;
  double unit_;  // bytes per unit of a segment's constraint: B
  std::vector<Pair> pairs_;
  std::vector<std::vector<std::vector<size_t>>> pairs_of_;  // per option: its pairs
};

}  // namespace detail
}  // namespace plan
}  // namespace ckpt
