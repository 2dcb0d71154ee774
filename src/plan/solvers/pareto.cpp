// rotor's program over (device, host) Pareto points: docs/memory-model.md, "Offloading".

#include "pareto.h"

#include <algorithm>
#include <iterator>
#include <limits>

namespace ckpt {
namespace plan {
namespace detail {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();
// Steps of max_work a point costs: a point (made, sorted, filtered) measured about 250 ns, a step
// of exact.cpp's program about 10-15 ns.
constexpr int64_t kPointWork = 16;

size_t triangle(int length, int i, int l) {
  const auto n = static_cast<size_t>(length + 1);
  const auto si = static_cast<size_t>(i);
  return si * n - si * (si - (si > 0 ? 1 : 0)) / 2 + static_cast<size_t>(l - i);
}

}  // namespace

ParetoProgram::ParetoProgram(const Chain& chain, int64_t memory, int64_t host, bool restricted,
                             int64_t max_work)
    : c_(byte_costs(chain)),
      memory_(memory),
      host_(host),
      restricted_(restricted),
      max_work_(max_work),
      table_(static_cast<size_t>(c_.length + 1) * static_cast<size_t>(c_.length + 2) / 2),
      prefix_(static_cast<size_t>(c_.length) + 1),
      forward_(static_cast<size_t>(c_.length) + 1) {
  // Every entry reads entries of shorter intervals: (i + 1, l), (j, l) and (i, j - 1).
  for (int i = c_.length; i >= 0 && completed_; --i) {
    fill_forward_input_prefixes(c_, i, prefix_, forward_);
    for (int l = i; l <= c_.length && completed_; ++l) build(i, l);
  }
}

const std::vector<ParetoPoint>& ParetoProgram::at(int i, int l) const {
  return table_[triangle(c_.length, i, l)];
}

double ParetoProgram::value(int i, int l, int64_t memory, int64_t host) const {
  double best = kInfinity;
  for (const ParetoPoint& p : at(i, l)) {
    if (p.memory > memory) break;
    if (p.host <= host) best = std::min(best, p.time);
  }
  return best;
}

Schedule ParetoProgram::schedule(int64_t memory, int64_t host) const {
  Schedule schedule;
  const auto choose = [this](int i, int l, int64_t m, int64_t h) {
    return best_choice(
        c_, restricted_, i, l, m, h,
        [this](int a, int b, int64_t at_m, int64_t at_h) { return value(a, b, at_m, at_h); },
        [](int) { return true; });
  };
  emit_ops(c_, 0, c_.length, memory, host, choose, schedule.ops);
  return schedule;
}

// Every point counts as work, kept or not: the work bounds the loops that make them.
void ParetoProgram::add(const ParetoPoint& point) {
  work_ += kPointWork;
  if (work_ > max_work_) completed_ = false;
  if (point.memory <= memory_ && point.host <= host_) candidates_.push_back(point);
}

void ParetoProgram::build(int i, int l) {
  candidates_.clear();
  if (i == c_.length) {
    add({c_.x_at(i), 0, 0.0});
  } else {
    if (forward_all_allowed(restricted_, c_.length, i, l)) {
      for (int k = 0; k < c_.options(i); ++k) add_forward_all(i, l, k);
    }
    for (int j = i + 1; j <= l && completed_; ++j) {
      const auto sj = static_cast<size_t>(j);
      const int64_t need = std::max(c_.x[static_cast<size_t>(l) + 1] + forward_[sj], c_.x[sj]) +
                           c_.gradients_from(l + 1);
      add_forward_input(i, j, l, prefix_[sj], need);
    }
  }
  keep_pareto(i, l);
}

// Case (b): Fall_i^k, then i+1..l with its saved bytes and its host bytes held, then B_i^k.
void ParetoProgram::add_forward_all(int i, int l, int k) {
  const double cost = c_.forward_backward_time(i, k);
  const int64_t need = c_.forward_all_need(i, l, k);
  const int64_t host = c_.host_at(i, k);
  if (l == i) return add({need, host, cost});
  for (const ParetoPoint& p : at(i + 1, l)) {
    add({std::max(need, p.memory + c_.saved_at(i, k)), p.host + host, cost + p.time});
  }
}

// Case (a): Fck_i Fn_{i+1..j-1}, then j..l with x_j held, then i..j-1: one after the other, so
// the host memory is the larger of theirs.
void ParetoProgram::add_forward_input(int i, int j, int l, double prefix, int64_t need) {
  const int64_t shift = c_.x_at(j);
  for (const ParetoPoint& right : at(j, l)) {
    if (right.memory + shift > memory_ || !completed_) break;
    for (const ParetoPoint& left : at(i, j - 1)) {
      if (left.memory > memory_) break;
      add({std::max({need, right.memory + shift, left.memory}), std::max(right.host, left.host),
           (prefix + right.time) + left.time});
    }
  }
}

// The entry keeps the candidates no other one beats in all of device, host and time, by
// increasing device memory. Walking them that way, a candidate is beaten when an earlier kept one
// has no more host memory and no more time: `staircase_` holds the kept (host, time) pairs that
// no other kept pair beats, by increasing host and so decreasing time.
void ParetoProgram::keep_pareto(int i, int l) {
  std::sort(candidates_.begin(), candidates_.end(), [](const ParetoPoint& a, const ParetoPoint& b) {
    if (a.memory != b.memory) return a.memory < b.memory;
    return a.host != b.host ? a.host < b.host : a.time < b.time;
  });
  std::vector<ParetoPoint>& kept = table_[triangle(c_.length, i, l)];
  staircase_.clear();
  for (const ParetoPoint& p : candidates_) {
    auto next = staircase_.upper_bound(p.host);
    if (next != staircase_.begin() && std::prev(next)->second <= p.time) continue;
    kept.push_back(p);
    while (next != staircase_.end() && next->second >= p.time) next = staircase_.erase(next);
    staircase_[p.host] = p.time;
  }
}

}  // namespace detail
}  // namespace plan
}  // namespace ckpt
