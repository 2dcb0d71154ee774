#pragma once

// The brute force over persistent schedules, for the planner's oracles: every schedule of rotor's
// family, enumerated without the solver and scored with reference_accounting.h.

#include <gtest/gtest.h>

#include "reference_accounting.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <utility>
#include <vector>

#include "ckpt/plan/simulator.h"

namespace ckpt {
namespace plan {
namespace test {

// Every persistent schedule (rotor's family), enumerated independently of the solver: to
// reverse stages i..l with x_i held and δ_{l+1} available, either run Fall_i (any option),
// reverse i+1..l and run B_i, or run Fck_i, Fn_{i+1..j-1}, reverse j..l from the checkpoint
// x_j, then reverse i..j-1. Stage L is the loss.
class PersistentSchedules {
 public:
  PersistentSchedules(const Chain& chain, bool restricted)
      : chain_(chain), restricted_(restricted) {}

  const std::vector<std::vector<Op>>& all(int i, int l) {
    auto found = memo_.find({i, l});
    if (found != memo_.end()) return found->second;
    std::vector<std::vector<Op>> result;
    const int length = chain_.size();
    if (i == length) {
      result.push_back({Op{OpKind::Loss, length, 0}});
    } else {
      const int options = chain_.stages[static_cast<size_t>(i)].option_count();
      for (int k = 0; k < options; ++k) {
        if (l == i) {
          result.push_back({Op{OpKind::ForwardAll, i, k}, Op{OpKind::Backward, i, k}});
        } else if (!restricted_ || (i == length - 1 && l == length)) {
          for (const auto& rest : all(i + 1, l)) {
            std::vector<Op> ops = {Op{OpKind::ForwardAll, i, k}};
            ops.insert(ops.end(), rest.begin(), rest.end());
            ops.push_back(Op{OpKind::Backward, i, k});
            result.push_back(std::move(ops));
          }
        }
      }
      for (int j = i + 1; j <= l; ++j) {
        std::vector<Op> prefix = {Op{OpKind::ForwardInput, i, 0}};
        for (int k = i + 1; k < j; ++k) prefix.push_back(Op{OpKind::ForwardNone, k, 0});
        const auto rights = all(j, l);
        const auto lefts = all(i, j - 1);
        for (const auto& right : rights) {
          for (const auto& left : lefts) {
            std::vector<Op> ops = prefix;
            ops.insert(ops.end(), right.begin(), right.end());
            ops.insert(ops.end(), left.begin(), left.end());
            result.push_back(std::move(ops));
          }
        }
      }
    }
    return memo_.emplace(std::make_pair(i, l), std::move(result)).first->second;
  }

 private:
  const Chain& chain_;
  bool restricted_;
  std::map<std::pair<int, int>, std::vector<std::vector<Op>>> memo_;
};

struct Scored {
  double time;
  int64_t peak_bytes;
  int64_t host_peak_bytes;
};

// Scores every persistent schedule with the tests' own accounting (not the solver's simulate),
// and checks on the way that the simulator agrees with it.
inline std::vector<Scored> score_persistent_schedules(const Chain& chain, bool restricted) {
  PersistentSchedules schedules(chain, restricted);
  std::vector<Scored> results;
  for (const auto& ops : schedules.all(0, chain.size())) {
    const ReferenceScore score = ReferenceAccounting(chain).score(Schedule{ops});
    EXPECT_TRUE(score.valid) << to_string(Schedule{ops});
    const SimulationResult simulated = simulate(chain, Schedule{ops});
    EXPECT_EQ(simulated.peak_bytes, score.peak_bytes) << to_string(Schedule{ops});
    EXPECT_EQ(simulated.time, score.time) << to_string(Schedule{ops});
    EXPECT_EQ(simulated.host_peak_bytes, score.host_peak_bytes) << to_string(Schedule{ops});
    results.push_back({score.time, score.peak_bytes, score.host_peak_bytes});
  }
  return results;
}

inline double fastest_within(const std::vector<Scored>& all, int64_t budget,
                             int64_t host_budget = std::numeric_limits<int64_t>::max()) {
  double best = std::numeric_limits<double>::infinity();
  for (const Scored& s : all) {
    if (s.peak_bytes <= budget && s.host_peak_bytes <= host_budget) best = std::min(best, s.time);
  }
  return best;
}

// The smallest device peak of a schedule within `host_budget`; INT64_MAX when none.
inline int64_t smallest_peak_within(const std::vector<Scored>& all, int64_t host_budget) {
  int64_t best = std::numeric_limits<int64_t>::max();
  for (const Scored& s : all) {
    if (s.host_peak_bytes <= host_budget) best = std::min(best, s.peak_bytes);
  }
  return best;
}

// The smallest host peak of a schedule within `budget`; -1 when none.
inline int64_t smallest_host_peak_within(const std::vector<Scored>& all, int64_t budget) {
  int64_t best = -1;
  for (const Scored& s : all) {
    if (s.peak_bytes <= budget && (best < 0 || s.host_peak_bytes < best)) {
      best = s.host_peak_bytes;
    }
  }
  return best;
}

}  // namespace test
}  // namespace plan
}  // namespace ckpt
