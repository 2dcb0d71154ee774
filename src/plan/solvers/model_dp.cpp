// The model heuristic's first guess: a dynamic program over the candidates in forward order whose
// state is the bytes the decided candidates add under the windows still to come ("carry").
// Exact, but for the thinning of its fronts, where windows nest and each option adds a constant
// plateau under the windows inside its own; elsewhere a guess that model_heuristic.cpp repairs.
// With exclusions, entries compare only with those whose paths exclude the same options of the
// candidates still to come (their "signature"), so that none is dropped for one that is denied
// what it may take.

#include <algorithm>
#include <limits>
#include <map>
#include <numeric>
#include <utility>
#include <vector>

#include "model_problem.h"

namespace ckpt {
namespace plan {
namespace detail {
namespace {

constexpr size_t kFrontSize = 2048;  // entries kept per candidate

struct Entry {
  int64_t carry = 0;
  double value = 0.0;  // seconds over the plain step, or the peak so far
  int64_t host = 0;
  int parent = -1;
  int position = 0;
};

// What one option of a candidate does in the program: its peak over the segments it owns (those
// no later window covers) before the carry, and the carry it adds for the later candidates (its
// largest delta under them).
struct Move {
  bool owns = false;
  int64_t own_peak = 0;
  int64_t carry = 0;
};

std::vector<int> forward_order(const ModelProblem& problem) {
  std::vector<int> order(problem.candidates.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    const ModelCandidate& x = problem.candidates[a];
    const ModelCandidate& y = problem.candidates[b];
    return x.begin < y.begin || (x.begin == y.begin && x.length > y.length);
  });
  return order;
}

std::vector<std::vector<Move>> moves(const ModelProblem& problem, const std::vector<int>& order,
                                     const std::vector<int>& owner) {
  std::vector<std::vector<Move>> out(problem.candidates.size());
  for (int c : order) {
    const ModelCandidate& candidate = problem.candidates[c];
    for (const ModelOption& option : candidate.options) {
      Move move;
      bool carries = false;
      for (int i = 0; i < candidate.length; ++i) {
        const int k = candidate.begin + i;
        if (owner[k] == c) {
          const int64_t peak = problem.base[k] + option.delta[i];
          move.own_peak = move.owns ? std::max(move.own_peak, peak) : peak;
          move.owns = true;
        } else {
          move.carry = carries ? std::max(move.carry, option.delta[i]) : option.delta[i];
          carries = true;
        }
      }
      out[c].push_back(move);
    }
  }
  return out;
}

// Keeps the entries no other beats in both carry and value, by rising carry.
std::vector<Entry> pareto(std::vector<Entry> entries) {
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.carry < b.carry || (a.carry == b.carry && a.value < b.value);
  });
  std::vector<Entry> kept;
  for (const Entry& e : entries) {
    if (kept.empty() || e.value < kept.back().value) kept.push_back(e);
  }
  return kept;
}

// At most about `size` entries of a front: the one of lowest carry, then the fastest of each of
// `size` equal carry ranges.
std::vector<Entry> thinned(std::vector<Entry> kept, size_t size) {
  if (kept.size() <= size) return kept;
  const double width = static_cast<double>(kept.back().carry - kept.front().carry) / size;
  std::vector<Entry> thinned{kept.front()};
  auto bucket = [&](const Entry& e) {
    return static_cast<int64_t>(static_cast<double>(e.carry - kept.front().carry) / width);
  };
  for (size_t i = 1; i < kept.size(); ++i) {
    if (i + 1 == kept.size() || bucket(kept[i + 1]) != bucket(kept[i])) thinned.push_back(kept[i]);
  }
  return thinned;
}

// What the options on an entry's path exclude of the candidates still to come: (candidate,
// position) pairs, sorted. Interned per layer; transitions cached per signature and position.
class SignatureTable {
 public:
  SignatureTable(const ModelProblem& problem, const std::vector<size_t>& rank)
      : problem_(problem), rank_(rank), last_{{}} {}

  // Starts the layer of candidate c.
  void begin(int c) {
    c_ = c;
    next_.clear();
    ids_.clear();
    cache_.assign(last_.size(), std::vector<int>(problem_.candidates[c].options.size(), kUnknown));
  }
  // The signature once c takes `position` after an entry of signature s; -1 where s excludes it.
  int next(int s, int position) {
    int& id = cache_[s][position];
    if (id != kUnknown) return id;
    const Signature& from = last_[s];
    if (std::binary_search(from.begin(), from.end(), std::make_pair(c_, position))) return id = -1;
    Signature to;
    for (const auto& pair : from) {
      if (pair.first != c_) to.push_back(pair);  // c is decided now
    }
    for (const auto& pair : problem_.candidates[c_].options[position].excludes) {
      if (rank_[pair.first] > rank_[c_]) to.push_back(pair);
    }
    std::sort(to.begin(), to.end());
    to.erase(std::unique(to.begin(), to.end()), to.end());
    const auto [at, added] = ids_.emplace(to, static_cast<int>(next_.size()));
    if (added) next_.push_back(to);
    return id = at->second;
  }
  // The layer's signatures become those entries of the next layer come from.
  void end() { last_.swap(next_); }

 private:
  using Signature = std::vector<std::pair<int, int>>;
  static constexpr int kUnknown = -2;
  const ModelProblem& problem_;
  const std::vector<size_t>& rank_;
  int c_ = 0;
  std::vector<Signature> last_, next_;
  std::map<Signature, int> ids_;
  std::vector<std::vector<int>> cache_;
};

// Which candidate owns each segment: the last in `order` whose window covers it (-1: none).
std::vector<int> owners(const ModelProblem& problem, const std::vector<int>& order) {
  std::vector<int> owner(problem.base.size(), -1);
  for (int c : order) {
    const ModelCandidate& candidate = problem.candidates[c];
    for (int i = 0; i < candidate.length; ++i) owner[candidate.begin + i] = c;
  }
  return owner;
}

class Program {
 public:
  Program(const ModelProblem& problem, const ModelLimits& limits, bool by_peak)
      : problem_(problem),
        limits_(limits),
        by_peak_(by_peak),
        order_(forward_order(problem)),
        owner_(owners(problem, order_)),
        table_(moves(problem, order_, owner_)),
        rank_(order_.size()),
        signatures_(problem, rank_) {
    for (size_t d = 0; d < order_.size(); ++d) rank_[order_[d]] = d;
  }

  std::vector<int> solve() {
    double fixed = -std::numeric_limits<double>::infinity();  // the peak where no window covers
    for (size_t k = 0; k < owner_.size(); ++k) {
      if (owner_[k] < 0) fixed = std::max(fixed, static_cast<double>(problem_.base[k]));
    }
    if (!by_peak_ && fixed > static_cast<double>(limits_.budget)) return {};
    layers_.assign(1, {Entry{0, by_peak_ ? fixed : 0.0}});
    signature_.assign(1, 0);
    for (int c : order_) {
      layers_.push_back(layer(step(c)));
      if (layers_.back().empty()) return {};
    }
    return trace();
  }

 private:
  // The entries after candidate c from those of the last layer, by signature (with exclusions;
  // one group without).
  std::vector<std::vector<Entry>> step(int c) {
    const ModelCandidate& candidate = problem_.candidates[c];
    std::vector<std::vector<Entry>> next(1);
    if (problem_.has_exclusions) signatures_.begin(c);
    for (size_t e = 0; e < layers_.back().size(); ++e) {
      const Entry& from = layers_.back()[e];
      for (size_t m = 0; m < candidate.options.size(); ++m) {
        const Move& move = table_[c][m];
        const ModelOption& option = candidate.options[m];
        const int64_t peak = move.own_peak + from.carry;
        if ((move.owns && !by_peak_ && peak > limits_.budget) ||
            from.host + option.host > limits_.host_budget) {
          continue;
        }
        const int signature =
            problem_.has_exclusions ? signatures_.next(signature_[e], static_cast<int>(m)) : 0;
        if (signature < 0) continue;  // the path excludes this option
        if (static_cast<size_t>(signature) >= next.size()) next.resize(signature + 1);
        const double value = !by_peak_   ? from.value + option.extra
                             : move.owns ? std::max(from.value, static_cast<double>(peak))
                                         : from.value;
        next[signature].push_back(Entry{from.carry + move.carry, value, from.host + option.host,
                                        static_cast<int>(e), static_cast<int>(m)});
      }
    }
    if (problem_.has_exclusions) signatures_.end();
    return next;
  }

  // The next layer: each signature's front, thinned to an even share of kFrontSize where they
  // hold more; signature_ records each entry's signature.
  std::vector<Entry> layer(std::vector<std::vector<Entry>> groups) {
    size_t total = 0, fronts = 0;
    for (std::vector<Entry>& group : groups) {
      group = pareto(std::move(group));
      total += group.size();
      fronts += !group.empty();
    }
    const size_t share = total <= kFrontSize ? total : std::max<size_t>(1, kFrontSize / fronts);
    signature_.clear();
    for (size_t s = 0; s < groups.size(); ++s) {
      groups[s] = thinned(std::move(groups[s]), share);
      signature_.insert(signature_.end(), groups[s].size(), static_cast<int>(s));
    }
    if (groups.size() == 1) return std::move(groups[0]);
    std::vector<Entry> out;
    for (const std::vector<Entry>& group : groups) {
      out.insert(out.end(), group.begin(), group.end());
    }
    return out;
  }

  // The positions of the best last entry, traced back through its parents.
  std::vector<int> trace() const {
    const std::vector<Entry>& last = layers_.back();
    int e = static_cast<int>(
        std::min_element(last.begin(), last.end(),
                         [](const Entry& a, const Entry& b) { return a.value < b.value; }) -
        last.begin());
    std::vector<int> positions(problem_.candidates.size(), 0);
    for (size_t d = order_.size(); d > 0; --d) {
      const Entry& entry = layers_[d][e];
      positions[order_[d - 1]] = entry.position;
      e = entry.parent;
    }
    return positions;
  }

  const ModelProblem& problem_;
  const ModelLimits& limits_;
  const bool by_peak_;
  const std::vector<int> order_;
  const std::vector<int> owner_;
  const std::vector<std::vector<Move>> table_;
  std::vector<size_t> rank_;  // each candidate's place in order_
  SignatureTable signatures_;
  std::vector<int> signature_;  // of each entry of the last layer, with exclusions
  std::vector<std::vector<Entry>> layers_;
};

}  // namespace

std::vector<int> dp_choice(const ModelProblem& problem, const ModelLimits& limits, bool by_peak) {
  return Program(problem, limits, by_peak).solve();
}

}  // namespace detail
}  // namespace plan
}  // namespace ckpt
