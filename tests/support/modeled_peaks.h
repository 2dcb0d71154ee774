#pragma once

// Planning without the device: a meta profile's predicted peaks against a measured profile's.

#include <ckpt/plan/chain.h>
#include <ckpt/plan/simulator.h>
#include <ckpt/plan/solvers.h>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

namespace ckpt {
namespace test {

inline double relative_difference(int64_t modeled, int64_t real) {
  return std::abs(static_cast<double>(modeled - real)) / static_cast<double>(real);
}

// The peaks a plan of the modeled chain predicts, against the same schedule simulated on the
// real chain, at the store-everything budget, the smallest one and halfway.
inline void expect_peaks_within_two_percent(const plan::Chain& modeled, const plan::Chain& real) {
  ASSERT_EQ(modeled.size(), real.size());
  plan::OptimalOptions options;
  const int64_t smallest = plan::min_feasible_budget_bytes(modeled, options);
  const int64_t largest = plan::simulate(modeled, plan::solve_no_checkpoint(modeled)).peak_bytes;
  EXPECT_LE(relative_difference(largest,
                                plan::simulate(real, plan::solve_no_checkpoint(real)).peak_bytes),
            0.02);
  EXPECT_LE(relative_difference(smallest, plan::min_feasible_budget_bytes(real, options)), 0.02);
  for (int64_t budget : {smallest, (smallest + largest) / 2, largest}) {
    const auto plan = plan::solve_optimal(modeled, budget, options);
    ASSERT_TRUE(plan.has_value()) << budget;
    const int64_t predicted = plan::simulate(modeled, *plan).peak_bytes;
    const int64_t on_real = plan::simulate(real, *plan).peak_bytes;
    EXPECT_LE(relative_difference(predicted, on_real), 0.02)
        << "budget " << budget << ": modeled " << predicted << ", measured profile " << on_real;
  }
}

}  // namespace test
}  // namespace ckpt
