#include "model_bound.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <tuple>
#include <utility>

namespace ckpt {
namespace plan {
namespace detail {
namespace {

struct Point {
  int64_t bytes = 0;
  double seconds = 0.0;
};

// The lower convex hull, from the origin, of what each option saves at offset i of the window
// against the fastest option, and what it costs.
std::vector<Point> hull(const ModelCandidate& candidate, int i) {
  const ModelOption& fastest = candidate.options.front();
  std::vector<Point> points;
  for (const ModelOption& option : candidate.options) {
    const int64_t saved = fastest.delta[i] - option.delta[i];
    if (saved > 0) points.push_back(Point{saved, option.extra - fastest.extra});
  }
  std::sort(points.begin(), points.end(), [](const Point& a, const Point& b) {
    return a.bytes < b.bytes || (a.bytes == b.bytes && a.seconds < b.seconds);
  });
  std::vector<Point> out{Point{}};
  for (const Point& p : points) {
    if (p.bytes == out.back().bytes) continue;  // the cheaper came first
    while (out.size() >= 2) {
      const Point& o = out[out.size() - 2];
      const Point& a = out.back();
      const double turn = static_cast<double>(a.bytes - o.bytes) * (p.seconds - o.seconds) -
                          (a.seconds - o.seconds) * static_cast<double>(p.bytes - o.bytes);
      if (turn > 0.0) break;
      out.pop_back();
    }
    out.push_back(p);
  }
  return out;
}

}  // namespace

SegmentBound::SegmentBound(const ModelProblem& problem, int segment) : segment_(segment) {
  for (size_t c = 0; c < problem.candidates.size(); ++c) {
    const ModelCandidate& candidate = problem.candidates[c];
    const int i = segment - candidate.begin;
    if (i < 0 || i >= candidate.length) continue;
    const std::vector<Point> points = hull(candidate, i);
    for (size_t p = 1; p < points.size(); ++p) {
      const int64_t bytes = points[p].bytes - points[p - 1].bytes;
      const double slope = (points[p].seconds - points[p - 1].seconds) / static_cast<double>(bytes);
      steps_.push_back(Step{slope, bytes, static_cast<int>(c)});
    }
  }
  std::stable_sort(steps_.begin(), steps_.end(),
                   [](const Step& a, const Step& b) { return a.slope < b.slope; });
}

void SegmentBound::restrict(const std::vector<char>& decided) {
  bytes_.assign(1, 0);
  seconds_.assign(1, 0.0);
  for (const Step& step : steps_) {
    if (decided[step.candidate]) continue;
    bytes_.push_back(bytes_.back() + step.bytes);
    seconds_.push_back(seconds_.back() + step.slope * static_cast<double>(step.bytes));
  }
}

double SegmentBound::cost(int64_t overflow) const {
  if (overflow <= 0) return 0.0;
  if (overflow > bytes_.back()) return std::numeric_limits<double>::infinity();
  // The cheapest steps first, the last of them in part.
  const size_t s = static_cast<size_t>(std::lower_bound(bytes_.begin(), bytes_.end(), overflow) -
                                       bytes_.begin());
  const double slope =
      (seconds_[s] - seconds_[s - 1]) / static_cast<double>(bytes_[s] - bytes_[s - 1]);
  return seconds_[s - 1] + slope * static_cast<double>(overflow - bytes_[s - 1]);
}

SeparableBound::SeparableBound(const ModelProblem& problem)
    : problem_(problem),
      option_(problem.candidates.size()),
      least_(problem.candidates.size()),
      response_(problem.candidates.size(), 0) {
  for (size_t c = 0; c < option_.size(); ++c)
    option_[c].assign(problem.candidates[c].options.size(), 0.0);
}

template <typename Term>
double SeparableBound::evaluate(double constant, Term term, std::vector<int64_t>& loads) {
  loads = problem_.base;
  double value = constant, magnitude = std::fabs(constant);
  for (size_t c = 0; c < problem_.candidates.size(); ++c) {
    const ModelCandidate& candidate = problem_.candidates[c];
    for (size_t m = 0; m < candidate.options.size(); ++m) {
      option_[c][m] = term(c, m);
    }
    const size_t m = static_cast<size_t>(std::min_element(option_[c].begin(), option_[c].end()) -
                                         option_[c].begin());
    least_[c] = option_[c][m];
    response_[c] = static_cast<int>(m);
    value += least_[c];
    magnitude += std::fabs(least_[c]);
    const ModelOption& response = candidate.options[m];
    for (int i = 0; i < candidate.length; ++i) loads[candidate.begin + i] += response.delta[i];
  }
  slack_ = 1e-9 * magnitude + 1e-12;
  return value;
}

namespace {

// w . d over a candidate's window.
double dot(const std::vector<double>& weights, const ModelCandidate& candidate,
           const ModelOption& option) {
  double sum = 0.0;
  for (int i = 0; i < candidate.length; ++i) {
    sum += weights[candidate.begin + i] * static_cast<double>(option.delta[i]);
  }
  return sum;
}

}  // namespace

constexpr double kClip = 2.0, kRate = 0.2;

PeakWeights::PeakWeights(const ModelProblem& problem) : SeparableBound(problem) {
  const size_t segments = problem.base.size();
  if (segments == 0) return;  // every bound 0, the peak of no segments
  constexpr int kWeightRounds = 300;
  std::vector<double> weights(segments, 1.0 / static_cast<double>(segments)), best = weights;
  std::vector<double> score(segments, 0.0);
  std::vector<int64_t> loads;
  double highest = -std::numeric_limits<double>::infinity();
  for (int round = 0; round < kWeightRounds; ++round) {
    const double value = evaluate(weights, loads);
    if (value > highest) std::tie(highest, best) = std::make_pair(value, weights);
    // Weight moves to the segments the best responses load most, in units of the gap between
    // their peak and the bound.
    const int64_t high = *std::max_element(loads.begin(), loads.end());
    const double gap = std::max(1.0, static_cast<double>(high) - value);
    for (size_t k = 0; k < segments; ++k) {
      score[k] += std::max(-kClip, static_cast<double>(loads[k] - high) / gap);
    }
    const double top = *std::max_element(score.begin(), score.end());
    double sum = 0.0;
    for (size_t k = 0; k < segments; ++k) sum += weights[k] = std::exp(kRate * (score[k] - top));
    for (double& w : weights) w /= sum;
  }
  bound_ = evaluate(best, loads);
}

double PeakWeights::evaluate(const std::vector<double>& weights, std::vector<int64_t>& loads) {
  double constant = 0.0;
  for (size_t k = 0; k < weights.size(); ++k) {
    constant += weights[k] * static_cast<double>(problem_.base[k]);
  }
  return SeparableBound::evaluate(
      constant,
      [&](size_t c, size_t m) {
        const ModelCandidate& candidate = problem_.candidates[c];
        return dot(weights, candidate, candidate.options[m]);
      },
      loads);
}

TimeMultipliers::TimeMultipliers(const ModelProblem& problem, int64_t budget, double target)
    : SeparableBound(problem),
      budget_(budget),
      unit_(std::max(1.0, static_cast<double>(budget))),
      pairs_of_(problem.candidates.size()) {
  for (size_t c = 0; c < problem.candidates.size(); ++c) {
    pairs_of_[c].resize(problem.candidates[c].options.size());
  }
  for (size_t c = 0; c < problem.candidates.size(); ++c) {
    const ModelCandidate& candidate = problem.candidates[c];
    for (size_t m = 0; m < candidate.options.size(); ++m) {
      for (const auto& [d, q] : candidate.options[m].excludes) {
        if (d < static_cast<int>(c)) continue;  // listed on both sides: counted once, from c
        pairs_of_[c][m].push_back(pairs_.size());
        pairs_of_[d][q].push_back(pairs_.size());
        pairs_.push_back(Pair{static_cast<int>(c), static_cast<int>(m), d, q});
      }
    }
  }
  const size_t segments = problem.base.size();
  std::vector<double> multipliers(segments + pairs_.size(), 0.0), best = multipliers;
  std::vector<double> slopes(multipliers.size());
  std::vector<int64_t> loads;
  double highest = evaluate(multipliers, loads);
  if (problem.candidates.empty() || !std::isfinite(target)) return;  // no multipliers
  // Polyak's steps toward the target, halved after kPatience rounds without a better bound.
  constexpr int kRounds = 200, kPatience = 10;
  double scale = 2.0;
  double value = highest;  // of `multipliers`, whose best responses load `loads`
  for (int round = 0, stale = 0; round < kRounds && highest < target; ++round) {
    subgradient(loads, slopes);
    double norm = 0.0;
    for (size_t k = 0; k < slopes.size(); ++k) {
      if (multipliers[k] > 0.0 || slopes[k] > 0.0) norm += slopes[k] * slopes[k];
    }
    if (norm == 0.0) break;  // the responses fit, valid, and every multiplier at rest: optimal
    const double step = scale * (target - value) / norm;
    for (size_t k = 0; k < slopes.size(); ++k) {
      multipliers[k] = std::max(0.0, multipliers[k] + step * slopes[k]);
    }
    value = evaluate(multipliers, loads);
    if (value > highest) {
      std::tie(highest, best) = std::make_pair(value, multipliers);
      stale = 0;
    } else if (++stale == kPatience) {
      scale /= 2;
      stale = 0;
    }
  }
  bound_ = evaluate(best, loads);
}

void TimeMultipliers::subgradient(const std::vector<int64_t>& loads,
                                  std::vector<double>& slopes) const {
  for (size_t k = 0; k < loads.size(); ++k) {
    slopes[k] = static_cast<double>(loads[k] - budget_) / unit_;
  }
  for (size_t p = 0; p < pairs_.size(); ++p) {
    const Pair& pair = pairs_[p];
    slopes[loads.size() + p] =
        (response_[pair.c] == pair.m ? 1.0 : 0.0) + (response_[pair.d] == pair.q ? 1.0 : 0.0) - 1.0;
  }
}

double TimeMultipliers::evaluate(const std::vector<double>& multipliers,
                                 std::vector<int64_t>& loads) {
  const size_t segments = problem_.base.size();
  double constant = 0.0;
  for (size_t k = 0; k < segments; ++k) {
    constant += multipliers[k] * static_cast<double>(problem_.base[k] - budget_) / unit_;
  }
  for (size_t p = 0; p < pairs_.size(); ++p) constant -= multipliers[segments + p];
  return SeparableBound::evaluate(
      constant,
      [&](size_t c, size_t m) {
        const ModelCandidate& candidate = problem_.candidates[c];
        double term = candidate.options[m].extra;
        for (int i = 0; i < candidate.length; ++i) {
          term += multipliers[candidate.begin + i] *
                  static_cast<double>(candidate.options[m].delta[i]) / unit_;
        }
        for (size_t p : pairs_of_[c][m]) term += multipliers[segments + p];
        return term;
      },
      loads);
}

}  // namespace detail
}  // namespace plan
}  // namespace ckpt
