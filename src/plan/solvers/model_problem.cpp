#include "model_problem.h"

#include <algorithm>
#include <tuple>
#include <utility>

namespace ckpt {
namespace plan {
namespace detail {
namespace {

double rate(const ModelCandidate& candidate) {
  double rate = std::numeric_limits<double>::infinity();
  const ModelOption& fastest = candidate.options.front();
  for (const ModelOption& option : candidate.options) {
    for (int i = 0; i < candidate.length; ++i) {
      const int64_t saved = fastest.delta[i] - option.delta[i];
      if (saved > 0) rate = std::min(rate, (option.extra - fastest.extra) / saved);
    }
  }
  return rate;
}

ModelCandidate sorted_candidate(const Candidate& candidate) {
  ModelCandidate out;
  out.begin = candidate.window_begin;
  for (const CandidateOption& option : candidate.options) {
    out.length = std::max(out.length, static_cast<int>(option.peak_delta.size()));
  }
  const size_t length = static_cast<size_t>(out.length);
  out.min_delta.assign(length, std::numeric_limits<int64_t>::max());
  out.min_host = std::numeric_limits<int64_t>::max();
  for (size_t o = 0; o < candidate.options.size(); ++o) {
    const CandidateOption& option = candidate.options[o];
    ModelOption m;
    m.index = static_cast<int>(o);
    m.extra = option.time - candidate.options[0].time;
    m.host = option.host_bytes;
    m.delta = option.peak_delta;
    m.delta.resize(length, 0);
    for (size_t i = 0; i < length; ++i) out.min_delta[i] = std::min(out.min_delta[i], m.delta[i]);
    out.min_host = std::min(out.min_host, m.host);
    out.options.push_back(std::move(m));
  }
  for (ModelOption& m : out.options) {
    m.excess.resize(length);
    for (size_t i = 0; i < length; ++i) m.excess[i] = m.delta[i] - out.min_delta[i];
  }
  std::sort(out.options.begin(), out.options.end(), [](const ModelOption& a, const ModelOption& b) {
    return std::tie(a.extra, a.host, a.index) < std::tie(b.extra, b.host, b.index);
  });
  out.rate = rate(out);
  for (const ModelOption& from : out.options) {
    for (const ModelOption& to : out.options) {
      std::vector<int>& rises = out.rises.emplace_back();
      for (int i = 0; i < out.length; ++i) {
        if (to.delta[i] > from.delta[i]) rises.push_back(i);
      }
    }
  }
  return out;
}

// Each option's exclusions, listed on both sides, by position in the sorted options.
void add_exclusions(const ModelProfile& profile, std::vector<ModelCandidate>& candidates) {
  std::vector<std::vector<int>> position(candidates.size());  // of each profile option index
  for (size_t c = 0; c < candidates.size(); ++c) {
    position[c].resize(candidates[c].options.size());
    for (size_t m = 0; m < candidates[c].options.size(); ++m) {
      position[c][static_cast<size_t>(candidates[c].options[m].index)] = static_cast<int>(m);
    }
  }
  for (size_t c = 0; c < candidates.size(); ++c) {
    const std::vector<CandidateOption>& options = profile.candidates[c].options;
    for (size_t o = 0; o < options.size(); ++o) {
      const int m = position[c][o];
      for (const OptionRef& ref : options[o].excludes) {
        const int n = position[static_cast<size_t>(ref.candidate)][static_cast<size_t>(ref.option)];
        candidates[c].options[m].excludes.emplace_back(ref.candidate, n);
        candidates[ref.candidate].options[n].excludes.emplace_back(static_cast<int>(c), m);
      }
    }
  }
  for (ModelCandidate& candidate : candidates) {
    for (ModelOption& option : candidate.options) {
      std::vector<std::pair<int, int>>& list = option.excludes;
      std::sort(list.begin(), list.end());
      list.erase(std::unique(list.begin(), list.end()), list.end());
    }
  }
}

}  // namespace

ModelProblem::ModelProblem(const ModelProfile& profile)
    : base(profile.segment_peak_bytes), step_time(profile.step_time) {
  profile.validate();
  for (const Candidate& candidate : profile.candidates) {
    candidates.push_back(sorted_candidate(candidate));
    for (const CandidateOption& option : candidate.options) {
      has_exclusions = has_exclusions || !option.excludes.empty();
    }
  }
  if (has_exclusions) add_exclusions(profile, candidates);
}

std::vector<int> ModelProblem::choice(const std::vector<int>& positions) const {
  std::vector<int> out(positions.size());
  for (size_t c = 0; c < positions.size(); ++c) {
    out[c] = candidates[c].options[static_cast<size_t>(positions[c])].index;
  }
  return out;
}

double ModelProblem::time(const std::vector<int>& positions) const {
  double seconds = 0.0;
  for (size_t c = 0; c < positions.size(); ++c)
    seconds += candidates[c].options[positions[c]].extra;
  return seconds;
}

SegmentLoads::SegmentLoads(const std::vector<int64_t>& base) {
  while (leaves_ < base.size()) leaves_ *= 2;
  // Padding leaves never win the maximum; without segments the one leaf reads 0.
  tree_.assign(2 * leaves_, base.empty() ? 0 : std::numeric_limits<int64_t>::min());
  std::copy(base.begin(), base.end(), tree_.begin() + static_cast<std::ptrdiff_t>(leaves_));
  for (size_t p = leaves_ - 1; p >= 1; --p) tree_[p] = std::max(tree_[2 * p], tree_[2 * p + 1]);
}

void SegmentLoads::add(int begin, const std::vector<int64_t>& values, int sign) {
  if (values.empty()) return;
  size_t lo = leaves_ + static_cast<size_t>(begin);
  size_t hi = lo + values.size() - 1;
  for (size_t i = 0; i < values.size(); ++i) tree_[lo + i] += sign * values[i];
  // Only the ancestors of [lo, hi] change: a range half as wide at each level.
  for (lo /= 2, hi /= 2; lo >= 1; lo /= 2, hi /= 2) {
    for (size_t p = lo; p <= hi; ++p) tree_[p] = std::max(tree_[2 * p], tree_[2 * p + 1]);
  }
}

ModelState::ModelState(const ModelProblem& problem, std::vector<int> at)
    : positions(std::move(at)), loads(problem.base) {
  for (size_t c = 0; c < positions.size(); ++c) {
    const ModelCandidate& candidate = problem.candidates[c];
    const ModelOption& option = candidate.options[static_cast<size_t>(positions[c])];
    loads.add(candidate.begin, option.delta, 1);
    host += option.host;
  }
}

void ModelState::change(const ModelProblem& problem, int c, int position) {
  const ModelCandidate& candidate = problem.candidates[static_cast<size_t>(c)];
  const ModelOption& from = candidate.options[static_cast<size_t>(positions[c])];
  const ModelOption& to = candidate.options[static_cast<size_t>(position)];
  loads.add(candidate.begin, from.delta, -1);
  loads.add(candidate.begin, to.delta, 1);
  host += to.host - from.host;
  positions[static_cast<size_t>(c)] = position;
}

bool ModelState::allows(const ModelProblem& problem, int c, int position) const {
  for (const auto& [d, p] : problem.candidates[c].options[position].excludes) {
    if (positions[d] == p) return false;
  }
  return true;
}

bool ModelBest::offer(double t, int64_t p, const std::vector<int>& at) {
  if (found && (t > time || (t == time && p >= peak))) return false;
  found = true;
  time = t;
  peak = p;
  positions = at;
  return true;
}

}  // namespace detail
}  // namespace plan
}  // namespace ckpt
