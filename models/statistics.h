#pragma once

// Summaries of measured times, one definition for the program (tools/ckpt) and the benchmarks
// (bench/), so that a "median step" means the same in every table they print.

#include <vector>

namespace ckpt {
namespace models {

/// The q-quantile of `values` (0 <= q <= 1), interpolated linearly between the two nearest
/// order statistics; 0 for no values.
double quantile(std::vector<double> values, double q);

/// The median of `values`: the middle value, or the mean of the two middle ones; 0 for no values.
double median(std::vector<double> values);

}  // namespace models
}  // namespace ckpt
