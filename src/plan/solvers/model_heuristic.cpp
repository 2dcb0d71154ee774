// The model heuristic: the dynamic program's guess (model_dp.cpp), repaired and improved against
// the exact loads. Repair: while the choice overflows a budget, the switch that removes the most
// overflow per second it costs. Improvement: switches to faster options while the choice fits.

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <tuple>
#include <utility>
#include <vector>

#include "model_bound.h"
#include "model_problem.h"

namespace ckpt {
namespace plan {
namespace detail {

namespace {

double overflow(int64_t value, int64_t limit) {
  return value > limit ? static_cast<double>(value) - static_cast<double>(limit) : 0.0;
}

// How much the overflow of both budgets (device bytes summed over segments, plus host bytes)
// falls when candidate c switches to `position`.
double relief(const ModelProblem& problem, const ModelState& state, const ModelLimits& limits,
              int c, int position) {
  const ModelCandidate& candidate = problem.candidates[c];
  const ModelOption& from = candidate.options[state.positions[c]];
  const ModelOption& to = candidate.options[position];
  double relief = overflow(state.host, limits.host_budget) -
                  overflow(state.host - from.host + to.host, limits.host_budget);
  for (int i = 0; i < candidate.length; ++i) {
    const int64_t load = state.loads.at(candidate.begin + i);
    relief +=
        overflow(load, limits.budget) - overflow(load - from.delta[i] + to.delta[i], limits.budget);
  }
  return relief;
}

// The segments whose load passes the budget, in order.
std::vector<int> overflowing(const ModelProblem& problem, const ModelState& state,
                             const ModelLimits& limits) {
  std::vector<int> out;
  for (int k = 0; k < static_cast<int>(problem.base.size()); ++k) {
    if (state.loads.at(k) > limits.budget) out.push_back(k);
  }
  return out;
}

// relief(), reading only the segments where it can be nonzero: where the switch adds bytes
// (ModelCandidate::rises), and those of `over` (the overflowing segments) in the window.
double relief(const ModelProblem& problem, const ModelState& state, const ModelLimits& limits,
              const std::vector<int>& over, int c, int position) {
  const ModelCandidate& candidate = problem.candidates[c];
  const int at = state.positions[c];
  const ModelOption& from = candidate.options[at];
  const ModelOption& to = candidate.options[position];
  double relief = overflow(state.host, limits.host_budget) -
                  overflow(state.host - from.host + to.host, limits.host_budget);
  const auto change = [&](int i) {
    const int64_t load = state.loads.at(candidate.begin + i);
    return overflow(load, limits.budget) -
           overflow(load - from.delta[i] + to.delta[i], limits.budget);
  };
  for (int i : candidate.rises[at * candidate.options.size() + position]) relief += change(i);
  const auto first = std::lower_bound(over.begin(), over.end(), candidate.begin);
  const auto last = std::lower_bound(first, over.end(), candidate.begin + candidate.length);
  for (auto k = first; k != last; ++k) {
    const int i = *k - candidate.begin;
    if (to.delta[i] <= from.delta[i]) relief += change(i);  // the others are rises
  }
  return relief;
}

bool fits(const ModelState& state, const ModelLimits& limits) {
  return state.loads.max() <= limits.budget && state.host <= limits.host_budget;
}

// The overflow of both budgets: device bytes summed over segments, plus host bytes.
double total_overflow(const ModelProblem& problem, const ModelState& state,
                      const ModelLimits& limits) {
  double total = overflow(state.host, limits.host_budget);
  for (size_t k = 0; k < problem.base.size(); ++k) {
    total += overflow(state.loads.at(static_cast<int>(k)), limits.budget);
  }
  return total;
}

// Whether switches a (already made in `state`) and then b leave the choice valid, where it was
// before a: only a pair with a or b can be violated.
bool pair_allowed(const ModelProblem& problem, const ModelState& state, std::pair<int, int> a,
                  std::pair<int, int> b) {
  if (!state.allows(problem, b.first, b.second)) return false;
  for (const auto& [d, p] : problem.candidates[a.first].options[a.second].excludes) {
    if ((d == b.first ? b.second : state.positions[d]) == p) return false;
  }
  return true;
}

// Where no single switch relieves the overflow, the pair of switches that relieves it most, on
// profiles with few options (kPairMoves): they cost (options)^2 windows.
constexpr size_t kPairMoves = 64;
bool switch_pair(const ModelProblem& problem, ModelState& state, const ModelLimits& limits) {
  std::vector<std::pair<int, int>> moves;
  for (size_t c = 0; c < problem.candidates.size(); ++c) {
    for (size_t m = 0; m < problem.candidates[c].options.size(); ++m) {
      if (static_cast<int>(m) != state.positions[c]) moves.emplace_back(c, m);
    }
  }
  if (moves.size() > kPairMoves) return false;
  double best = total_overflow(problem, state, limits);
  std::pair<size_t, size_t> pick{moves.size(), moves.size()};
  for (size_t a = 0; a < moves.size(); ++a) {
    const int was = state.positions[moves[a].first];
    state.change(problem, moves[a].first, moves[a].second);
    const double after = total_overflow(problem, state, limits);
    for (size_t b = 0; b < moves.size(); ++b) {
      if (moves[b].first == moves[a].first || !pair_allowed(problem, state, moves[a], moves[b])) {
        continue;
      }
      const double left = after - relief(problem, state, limits, moves[b].first, moves[b].second);
      if (left < best) std::tie(best, pick) = std::make_pair(left, std::make_pair(a, b));
    }
    state.change(problem, moves[a].first, was);
  }
  if (pick.first == moves.size()) return false;
  state.change(problem, moves[pick.first].first, moves[pick.first].second);
  state.change(problem, moves[pick.second].first, moves[pick.second].second);
  return true;
}

// A switch of candidate c to `position` and, where that option excludes the options of others,
// theirs (`followers`) to the options they may take that relieve most: the choice stays valid.
struct Switch {
  int c = -1;
  int position = 0;
  std::vector<std::pair<int, int>> followers;
  double relief = 0.0;  // of the overflow, as in relief()
  double cost = 0.0;    // seconds
};

// Plans the followers of switches against a state, as if the switches planned so far were made
// (their bytes per segment in `pending_`), without making them.
class Followers {
 public:
  Followers(const ModelProblem& problem, const ModelState& state, const ModelLimits& limits)
      : problem_(problem), state_(state), limits_(limits) {}

  // Fills s's followers, relief and cost; false where a candidate whose option s excludes has no
  // other option allowed.
  bool plan(Switch& s) {
    if (pending_.empty()) pending_.assign(problem_.base.size(), 0);  // only where exclusions are
    s.followers.clear();
    s.relief = s.cost = 0.0;
    bool ok = true;
    for (std::pair<int, int> next{s.c, s.position}; ok;) {
      s.relief += relief(next.first, next.second);
      s.cost += option(next.first, next.second).extra - option(next.first).extra;
      make(next.first, next.second);
      if (switched_.size() > 1) s.followers.push_back(next);
      const auto& excludes = problem_.candidates[s.c].options[s.position].excludes;
      const auto clash = std::find_if(excludes.begin(), excludes.end(),
                                      [&](const auto& e) { return position(e.first) == e.second; });
      if (clash == excludes.end()) break;
      next = {clash->first, best_allowed(clash->first)};
      ok = next.second >= 0;
    }
    clear();
    return ok;
  }

 private:
  int position(int d) const {
    for (const auto& [e, p] : switched_) {
      if (e == d) return p;
    }
    return state_.positions[d];
  }
  const ModelOption& option(int d, int p) const { return problem_.candidates[d].options[p]; }
  const ModelOption& option(int d) const { return option(d, position(d)); }

  // The position of candidate d allowed with the others' that relieves most; -1 where none is.
  int best_allowed(int d) const {
    int best = -1;
    double most = 0.0;
    for (int p = 0; p < static_cast<int>(problem_.candidates[d].options.size()); ++p) {
      const auto& excludes = option(d, p).excludes;
      if (p == position(d) || std::any_of(excludes.begin(), excludes.end(), [&](const auto& e) {
            return position(e.first) == e.second;
          })) {
        continue;
      }
      const double gain = relief(d, p);
      if (best < 0 || gain > most) std::tie(best, most) = std::make_pair(p, gain);
    }
    return best;
  }

  // relief() with the planned switches made.
  double relief(int d, int p) const {
    const ModelCandidate& candidate = problem_.candidates[d];
    const ModelOption& from = option(d);
    const ModelOption& to = option(d, p);
    const int64_t host = state_.host + host_;
    double relief = overflow(host, limits_.host_budget) -
                    overflow(host - from.host + to.host, limits_.host_budget);
    for (int i = 0; i < candidate.length; ++i) {
      const int64_t load = state_.loads.at(candidate.begin + i) + pending_[candidate.begin + i];
      relief += overflow(load, limits_.budget) -
                overflow(load - from.delta[i] + to.delta[i], limits_.budget);
    }
    return relief;
  }

  void make(int d, int p) {
    const ModelCandidate& candidate = problem_.candidates[d];
    const ModelOption& from = option(d);
    const ModelOption& to = option(d, p);
    host_ += to.host - from.host;
    for (int i = 0; i < candidate.length; ++i) {
      pending_[candidate.begin + i] += to.delta[i] - from.delta[i];
    }
    // Each candidate once: a follower's new option is allowed with s's, so it never clashes.
    switched_.emplace_back(d, p);
  }

  void clear() {
    for (const auto& [d, p] : switched_) {
      const ModelCandidate& candidate = problem_.candidates[d];
      std::fill_n(pending_.begin() + candidate.begin, candidate.length, 0);
    }
    switched_.clear();
    host_ = 0;
  }

  const ModelProblem& problem_;
  const ModelState& state_;
  const ModelLimits& limits_;
  std::vector<int64_t> pending_;
  std::vector<std::pair<int, int>> switched_;
  int64_t host_ = 0;
};

// The switch that removes the most overflow per second it costs (one that costs no time ranks by
// relief alone); c < 0 where none removes any.
Switch best_switch(const ModelProblem& problem, const ModelState& state,
                   const ModelLimits& limits) {
  std::tuple<bool, double, double> best{false, 0.0, 0.0};
  Switch pick, s;
  Followers followers(problem, state, limits);
  const std::vector<int> over = overflowing(problem, state, limits);
  for (size_t c = 0; c < problem.candidates.size(); ++c) {
    const ModelCandidate& candidate = problem.candidates[c];
    for (size_t m = 0; m < candidate.options.size(); ++m) {
      if (static_cast<int>(m) == state.positions[c]) continue;
      s.c = static_cast<int>(c);
      s.position = static_cast<int>(m);
      if (state.allows(problem, s.c, s.position)) {
        s.followers.clear();
        s.relief = relief(problem, state, limits, over, s.c, s.position);
        s.cost = candidate.options[m].extra - candidate.options[state.positions[c]].extra;
      } else if (relief(problem, state, limits, over, s.c, s.position) <= 0.0 ||
                 !followers.plan(s)) {
        continue;  // followers are planned for a switch that relieves on its own
      }
      if (s.relief <= 0.0) continue;
      const auto score = s.cost <= 0.0 ? std::make_tuple(true, s.relief, -s.cost)
                                       : std::make_tuple(false, s.relief / s.cost, 0.0);
      if (pick.c < 0 || score > best) std::tie(best, pick) = std::tie(score, s);
    }
  }
  return pick;
}

// Makes switch s and its followers; returns what they were, to undo them in reverse.
std::vector<std::pair<int, int>> make(const ModelProblem& problem, ModelState& state,
                                      const Switch& s) {
  std::vector<std::pair<int, int>> undo{{s.c, state.positions[s.c]}};
  state.change(problem, s.c, s.position);
  for (const auto& [d, p] : s.followers) {
    undo.emplace_back(d, state.positions[d]);
    state.change(problem, d, p);
  }
  return undo;
}

// Puts back what make() returned.
void undo(const ModelProblem& problem, ModelState& state,
          const std::vector<std::pair<int, int>>& was) {
  for (auto it = was.rbegin(); it != was.rend(); ++it) state.change(problem, it->first, it->second);
}

// Switches options until the choice fits; false when no switch reduces the overflow.
bool repair(const ModelProblem& problem, ModelState& state, const ModelLimits& limits) {
  while (!fits(state, limits)) {
    const Switch s = best_switch(problem, state, limits);
    if (s.c < 0) {
      if (!switch_pair(problem, state, limits)) return false;
      continue;
    }
    make(problem, state, s);
  }
  return true;
}

// Takes switches to faster options, the largest saving first, while the choice still fits.
void improve(const ModelProblem& problem, ModelState& state, const ModelLimits& limits) {
  for (bool changed = true; changed;) {
    changed = false;
    std::vector<std::tuple<double, int, int>> moves;  // (seconds saved, candidate, position)
    for (size_t c = 0; c < problem.candidates.size(); ++c) {
      const std::vector<ModelOption>& options = problem.candidates[c].options;
      for (int m = 0; m < state.positions[c]; ++m) {
        const double saved = options[state.positions[c]].extra - options[m].extra;
        if (saved > 0.0) moves.emplace_back(saved, static_cast<int>(c), m);
      }
    }
    std::stable_sort(moves.begin(), moves.end(),
                     [](const auto& a, const auto& b) { return std::get<0>(a) > std::get<0>(b); });
    Followers followers(problem, state, limits);
    for (const auto& [saved, c, m] : moves) {
      const std::vector<ModelOption>& options = problem.candidates[c].options;
      // A larger saving came first; a blocked switch goes with its followers if they still save.
      if (options[m].extra >= options[state.positions[c]].extra) continue;
      Switch s;
      s.c = c;
      s.position = m;
      if (!state.allows(problem, c, m) && (!followers.plan(s) || s.cost >= 0.0)) continue;
      const std::vector<std::pair<int, int>> was = make(problem, state, s);
      if (fits(state, limits)) {
        changed = true;
      } else {
        undo(problem, state, was);
      }
    }
  }
}

ModelBest best_of(const ModelProblem& problem, const ModelState& state) {
  ModelBest best;
  best.offer(problem.time(state.positions), state.loads.max(), state.positions);
  return best;
}

// Each candidate at its option 0, "stored": the plain step.
std::vector<int> stored(const ModelProblem& problem) {
  std::vector<int> positions;
  for (const ModelCandidate& candidate : problem.candidates) {
    const auto& options = candidate.options;
    positions.push_back(
        static_cast<int>(std::find_if(options.begin(), options.end(),
                                      [](const ModelOption& option) { return option.index == 0; }) -
                         options.begin()));
  }
  return positions;
}

// `positions` made valid: while two options exclude each other, one that is not "stored" takes
// its allowed option of lowest `score` (c, position), or "stored" where none is allowed. It ends:
// no candidate leaves "stored", and each other switch leaves fewer excluded pairs.
std::vector<int> legal(const ModelProblem& problem, std::vector<int> positions,
                       const std::function<double(int, int)>& score) {
  if (!problem.has_exclusions) return positions;
  const std::vector<int> plain = stored(problem);
  const auto allowed = [&](int c, int p) {
    const auto& excludes = problem.candidates[c].options[p].excludes;
    return std::none_of(excludes.begin(), excludes.end(),
                        [&](const auto& e) { return positions[e.first] == e.second; });
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (int c = 0; c < static_cast<int>(positions.size()); ++c) {
      if (allowed(c, positions[c])) continue;
      const auto& excludes = problem.candidates[c].options[positions[c]].excludes;
      const auto clash = std::find_if(excludes.begin(), excludes.end(), [&](const auto& e) {
        return positions[e.first] == e.second;
      });
      const int d = positions[c] != plain[c] ? c : clash->first;  // two "stored" never clash
      int best = -1;
      for (int p = 0; p < static_cast<int>(problem.candidates[d].options.size()); ++p) {
        if (allowed(d, p) && (best < 0 || score(d, p) < score(d, best))) best = p;
      }
      positions[d] = best >= 0 ? best : plain[d];
      changed = true;
    }
  }
  return positions;
}

// No choice peaks lower: each candidate at its smallest delta in every segment at once.
int64_t smallest_peak_bound(const ModelProblem& problem) {
  SegmentLoads loads(problem.base);
  for (const ModelCandidate& candidate : problem.candidates) {
    loads.add(candidate.begin, candidate.min_delta, 1);
  }
  return loads.max();
}

// The bytes an option adds over its window, summed.
int64_t delta_sum(const ModelOption& option) {
  return std::accumulate(option.delta.begin(), option.delta.end(), int64_t{0});
}

// delta_sum as a score for legal(): the thriftiest start's aim.
std::function<double(int, int)> bytes_score(const ModelProblem& problem) {
  return [&problem](int c, int p) {
    return static_cast<double>(delta_sum(problem.candidates[c].options[p]));
  };
}

// Each candidate at the option whose deltas sum lowest: a start far from the fastest.
std::vector<int> thriftiest(const ModelProblem& problem) {
  std::vector<int> positions;
  for (const ModelCandidate& candidate : problem.candidates) {
    const auto& options = candidate.options;
    positions.push_back(
        static_cast<int>(std::min_element(options.begin(), options.end(),
                                          [&](const ModelOption& a, const ModelOption& b) {
                                            return delta_sum(a) < delta_sum(b);
                                          }) -
                         options.begin()));
  }
  return positions;
}

}  // namespace

ModelBest heuristic_fastest(const ModelProblem& problem, const ModelLimits& limits) {
  // Repair can stall where no single switch relieves the overflow: three starts, the best kept.
  const auto time = [&](int c, int p) { return problem.candidates[c].options[p].extra; };
  std::vector<std::vector<int>> starts{
      dp_choice(problem, limits, /*by_peak=*/false),
      legal(problem, std::vector<int>(problem.candidates.size(), 0), time),
      legal(problem, thriftiest(problem), bytes_score(problem))};
  ModelBest best;
  for (std::vector<int>& start : starts) {
    if (start.empty()) continue;  // the program found nothing
    ModelState state(problem, std::move(start));
    if (!repair(problem, state, limits)) continue;
    improve(problem, state, limits);
    best.offer(problem.time(state.positions), state.loads.max(), state.positions);
  }
  return best;
}

ModelBest improved(const ModelProblem& problem, const ModelLimits& limits,
                   std::vector<int> positions) {
  ModelState state(problem, std::move(positions));
  improve(problem, state, limits);
  return best_of(problem, state);
}

ModelBest heuristic_lowest_peak(const ModelProblem& problem, const ModelLimits& limits) {
  const PeakWeights weights(problem);
  std::vector<ModelState> starts{ModelState(problem, stored(problem))};  // holds no host memory
  const auto weighted = [&](int c, int p) { return weights.option(c, p); };
  for (std::vector<int> start : {dp_choice(problem, limits, /*by_peak=*/true),
                                 legal(problem, thriftiest(problem), bytes_score(problem)),
                                 legal(problem, weights.response(), weighted)}) {
    if (start.empty()) continue;  // the program found nothing
    ModelState guess(problem, std::move(start));
    ModelLimits host_only = limits;
    host_only.budget = std::numeric_limits<int64_t>::max();
    if (repair(problem, guess, host_only)) starts.push_back(std::move(guess));
  }
  ModelState best =
      *std::min_element(starts.begin(), starts.end(),
                        [](const auto& a, const auto& b) { return a.loads.max() < b.loads.max(); });
  // Bisect on the peak, repairing the lowest choice so far, or another start, toward each target.
  starts.push_back(best);
  // No choice peaks below either bound (the weighted one less a margin for its rounding).
  int64_t low = std::max(
      smallest_peak_bound(problem),
      static_cast<int64_t>(std::ceil(weights.bound() - 1e-9 * std::fabs(weights.bound()) - 1e-6)));
  int64_t high = best.loads.max();
  // To a ten-thousandth of the peak: the failing targets, which try every start, are the costly
  // ones, and the search that follows closes what is left where it can.
  while (high - low > std::max<int64_t>(0, high / 10'000)) {
    ModelLimits target = limits;
    target.budget = low + (high - low) / 2;
    low = target.budget + 1;  // unless a start reaches it
    for (auto start = starts.rbegin(); start != starts.rend(); ++start) {
      ModelState trial = *start;
      if (!repair(problem, trial, target)) continue;
      best = trial;
      starts.back() = std::move(trial);
      high = best.loads.max();
      break;
    }
  }
  return best_of(problem, best);
}

}  // namespace detail
}  // namespace plan
}  // namespace ckpt
