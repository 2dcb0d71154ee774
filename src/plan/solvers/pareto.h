#pragma once

// rotor's dynamic program in exact bytes with host memory as a second resource (offloading,
// docs/memory-model.md, "Offloading"): each entry Opt(i, l, ·, ·) is kept as its Pareto points
// (device memory, host memory, time).

#include "ckpt/plan/chain.h"
#include "ckpt/plan/schedule.h"

#include <cstdint>
#include <map>
#include <vector>

#include "dp_terms.h"

namespace ckpt {
namespace plan {
namespace detail {

/// One schedule of an entry: it fits every (device, host) allowance at or above these.
struct ParetoPoint {
  int64_t memory = 0;  // device bytes, outside x_i
  int64_t host = 0;    // host bytes
  double time = 0.0;
};

/// The program on the dense entries, for device allowances up to `memory` (the budget less x_0)
/// and host allowances up to `host`. It stops once its points, 16 steps of `max_work` each (the
/// time of 16 steps of solve_exact's one-resource program), pass `max_work`.
class ParetoProgram {
 public:
  ParetoProgram(const Chain& chain, int64_t memory, int64_t host, bool restricted,
                int64_t max_work);

  bool completed() const { return completed_; }
  int64_t work() const { return work_; }
  /// The Pareto points of the whole chain (entry (0, L)), by increasing device memory.
  const std::vector<ParetoPoint>& front() const { return at(0, c_.length); }
  /// The fastest time within (memory, host), +infinity when no schedule fits.
  double value(int i, int l, int64_t memory, int64_t host) const;
  /// The schedule of value(0, L, memory, host); the caller checks that it is finite.
  Schedule schedule(int64_t memory, int64_t host) const;

 private:
  const std::vector<ParetoPoint>& at(int i, int l) const;
  void build(int i, int l);
  void add_forward_all(int i, int l, int k);
  void add_forward_input(int i, int j, int l, double prefix, int64_t need);
  void keep_pareto(int i, int l);
  void add(const ParetoPoint& point);

  Costs c_;
  int64_t memory_, host_;
  bool restricted_;
  int64_t max_work_;
  int64_t work_ = 0;
  bool completed_ = true;
  std::vector<std::vector<ParetoPoint>> table_;  // by triangle index (i, l)
  std::vector<double> prefix_;                   // fill_forward_input_prefixes
  std::vector<int64_t> forward_;
  std::vector<ParetoPoint> candidates_;  // scratch of build()
  std::map<int64_t, double> staircase_;  // scratch of keep_pareto()
};

}  // namespace detail
}  // namespace plan
}  // namespace ckpt
