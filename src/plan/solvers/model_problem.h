#pragma once

// The model solvers' shared view of a ModelProfile (docs/memory-model.md, "Any model"): options
// sorted by time with their deltas padded to the window, and segment loads whose maximum is kept
// up to date in O(window + log segments) per change.

#include <cstdint>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "ckpt/plan/model.h"

namespace ckpt {
namespace plan {
namespace detail {

// A pair of options a choice picks although the first lists the second in its `excludes`.
struct ModelConflict {
  int candidate = 0;
  int option = 0;
  OptionRef excluded;
};

// The first such pair of `choice` (indices in range), by the listing candidate's index; none
// where the choice is valid. Defined with the simulator (model.cpp), which reports it.
std::optional<ModelConflict> first_conflict(const ModelProfile& profile,
                                            const std::vector<int>& choice);

struct ModelOption {
  int index = 0;       // in Candidate::options
  double extra = 0.0;  // seconds over option 0
  int64_t host = 0;
  std::vector<int64_t> delta;   // one per window segment
  std::vector<int64_t> excess;  // delta less the candidate's smallest delta there (>= 0)
  // The options it cannot be chosen with, listed on either side: (candidate, position).
  std::vector<std::pair<int, int>> excludes;
};

struct ModelCandidate {
  int begin = 0;
  int length = 0;                    // of the window: the longest peak_delta of its options
  std::vector<ModelOption> options;  // by time, then host, then index
  std::vector<int64_t> min_delta;    // per window segment, over the options
  // Per pair of positions (from * options + to): the window offsets where `to` adds bytes over
  // `from`. Elsewhere that switch adds no overflow.
  std::vector<std::vector<int>> rises;
  int64_t min_host = 0;
  // The fewest seconds per byte any option saves against options[0], the fastest, in any segment
  // of the window (infinity where none saves).
  double rate = 0.0;
};

struct ModelProblem {
  explicit ModelProblem(const ModelProfile& profile);  // validates it
  std::vector<int64_t> base;                           // segment_peak_bytes
  double step_time = 0.0;                              // the plain step's seconds
  std::vector<ModelCandidate> candidates;              // in the profile's order
  bool has_exclusions = false;
  // The profile's option index of each candidate under `positions` (indices into `options`).
  std::vector<int> choice(const std::vector<int>& positions) const;
  // Seconds over the plain step under `positions`, summed in candidate order (one rounding for
  // every solver).
  double time(const std::vector<int>& positions) const;
};

// The peak of each segment under some choice; max() is their largest (0 without segments).
class SegmentLoads {
 public:
  explicit SegmentLoads(const std::vector<int64_t>& base);
  // Adds sign * values[i] to segment begin + i.
  void add(int begin, const std::vector<int64_t>& values, int sign);
  int64_t max() const { return tree_[1]; }
  int64_t at(int segment) const { return tree_[leaves_ + static_cast<size_t>(segment)]; }

 private:
  size_t leaves_ = 1;
  std::vector<int64_t> tree_;  // a max tree: node p covers nodes 2p and 2p + 1
};

// A choice (positions in each candidate's sorted options) with its loads and host bytes.
struct ModelState {
  ModelState(const ModelProblem& problem, std::vector<int> positions);
  void change(const ModelProblem& problem, int c, int position);  // candidate c to `position`
  // Whether candidate c may take `position` with the others' positions (no exclusion between).
  bool allows(const ModelProblem& problem, int c, int position) const;
  std::vector<int> positions;
  SegmentLoads loads;
  int64_t host = 0;
};

// A solver's best choice so far: lowest time, then lowest peak.
struct ModelBest {
  bool found = false;
  double time = std::numeric_limits<double>::infinity();
  int64_t peak = std::numeric_limits<int64_t>::max();
  std::vector<int> positions;
  // Records (time, peak, positions) when it beats the best; returns whether it did.
  bool offer(double t, int64_t p, const std::vector<int>& at);
};

// Limits of a search: device budget, host budget, node limit, and the fastest search's
// tolerance: a node is cut unless its completions may beat the best step by more than `gap` of
// the best's step time (0: exact).
struct ModelLimits {
  int64_t budget = std::numeric_limits<int64_t>::max();
  int64_t host_budget = std::numeric_limits<int64_t>::max();
  int64_t max_nodes = 0;
  double gap = 0.0;
};

// How a search ended: whether it finished within the node limit, and the lowest extra seconds
// (or peak) that its root's bounds allow any choice (infinity where it never expanded the root).
struct SearchOutcome {
  bool finished = false;
  double bound = std::numeric_limits<double>::infinity();
};

// The dynamic program's positions (model_dp.cpp): fastest within the budgets, or of the lowest
// peak within the host budget (by_peak); empty where it finds none.
std::vector<int> dp_choice(const ModelProblem& problem, const ModelLimits& limits, bool by_peak);

// The heuristic's fastest choice within the limits (model_heuristic.cpp); not found if it fails.
ModelBest heuristic_fastest(const ModelProblem& problem, const ModelLimits& limits);
// The heuristic's lowest-peak choice within the host budget; always found (all stored fits).
ModelBest heuristic_lowest_peak(const ModelProblem& problem, const ModelLimits& limits);

// `positions` with switches to faster options taken while the choice fits (it must fit).
ModelBest improved(const ModelProblem& problem, const ModelLimits& limits,
                   std::vector<int> positions);

// Branch and bound (model_search.cpp), starting from `incumbent`. Where it finishes within
// limits.max_nodes, `incumbent` is the optimum (within limits.gap), or not found where none fits.
SearchOutcome search_fastest(const ModelProblem& problem, const ModelLimits& limits,
                             ModelBest& incumbent);
SearchOutcome search_lowest_peak(const ModelProblem& problem, const ModelLimits& limits,
                                 ModelBest& incumbent);

}  // namespace detail
}  // namespace plan
}  // namespace ckpt
