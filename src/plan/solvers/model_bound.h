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

}  // namespace detail
}  // namespace plan
}  // namespace ckpt
