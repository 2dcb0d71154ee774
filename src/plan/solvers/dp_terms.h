#pragma once

// The terms of rotor's recursion shared by the solvers built on it (optimal.cpp, exact.cpp):
// a chain's sizes in one memory unit, the feasibility conditions of docs/memory-model.md, and
// the schedule an entry's choices spell out.

#include "ckpt/plan/chain.h"
#include "ckpt/plan/schedule.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <vector>

namespace ckpt {
namespace plan {
namespace detail {

// Sizes and times of a chain in some memory unit (bytes, or slots of the table), and the host
// memory of each option in its own unit (bytes, or the table's host slots).
struct Costs {
  int length = 0;
  std::vector<int64_t> x;  // |x_i|, i in [0, L+1], x[L+1] = 0
  // Gradients held once stages i..L-1 are backwarded (their gradient_bytes), i in [0, L+1]: the
  // terms of an entry (i, l) add those of the stages done at that moment.
  std::vector<int64_t> gradients;
  std::vector<int64_t> tmp;  // no-grad forward temporaries of stage i
  std::vector<double> time;  // no-grad forward time of stage i
  std::vector<std::vector<int64_t>> saved, forward_tmp, backward_tmp, host;
  // The times charged (Chain::forward_all_time, Chain::backward_time).
  std::vector<std::vector<double>> forward_time, backward_time;

  int options(int i) const { return static_cast<int>(saved[static_cast<size_t>(i)].size()); }
  int64_t x_at(int i) const { return x[static_cast<size_t>(i)]; }
  int64_t gradients_from(int i) const { return gradients[static_cast<size_t>(i)]; }
  int64_t saved_at(int i, int k) const {
    return saved[static_cast<size_t>(i)][static_cast<size_t>(k)];
  }
  int64_t host_at(int i, int k) const {
    return host[static_cast<size_t>(i)][static_cast<size_t>(k)];
  }
  // Time of Fall_i^k then B_i^k.
  double forward_backward_time(int i, int k) const {
    return forward_time[static_cast<size_t>(i)][static_cast<size_t>(k)] +
           backward_time[static_cast<size_t>(i)][static_cast<size_t>(k)];
  }
  // Memory needed (outside x_i, with δ_{l+1} held) by Fall_i with option k and by B_i
  // afterwards: max(forward peak, backward peak). The sub-problem i+1..l comes on top. Fall_i
  // runs with the gradients of the stages after l, B_i with those of the stages after i.
  int64_t forward_all_need(int i, int l, int k) const {
    const auto si = static_cast<size_t>(i);
    const auto sk = static_cast<size_t>(k);
    const int64_t kept = saved[si][sk];
    return std::max(
        x[static_cast<size_t>(l + 1)] + kept + forward_tmp[si][sk] + gradients_from(l + 1),
        x[si + 1] + kept + x[si] + backward_tmp[si][sk] + gradients_from(i + 1));
  }
};

// `convert` turns device bytes into the unit, `convert_host` host bytes.
template <class Convert, class ConvertHost>
Costs make_costs(const Chain& chain, Convert convert, ConvertHost convert_host) {
  Costs costs;
  costs.length = chain.size();
  const auto length = static_cast<size_t>(costs.length);
  costs.x.resize(length + 2, 0);
  for (int i = 0; i <= costs.length; ++i) {
    costs.x[static_cast<size_t>(i)] = convert(chain.activation_bytes(i));
  }
  costs.gradients.resize(length + 2, 0);
  int64_t gradient_bytes = 0;
  for (size_t i = length; i-- > 0;) {
    gradient_bytes += chain.stages[i].gradient_bytes;
    costs.gradients[i] = convert(gradient_bytes);
  }
  costs.tmp.resize(length);
  costs.time.resize(length);
  costs.saved.resize(length);
  costs.forward_tmp.resize(length);
  costs.backward_tmp.resize(length);
  costs.host.resize(length);
  costs.forward_time.resize(length);
  costs.backward_time.resize(length);
  for (size_t i = 0; i < length; ++i) {
    const Stage& stage = chain.stages[i];
    costs.tmp[i] = convert(stage.forward_tmp_bytes);
    costs.time[i] = stage.forward_time;
    for (int k = 0; k < stage.option_count(); ++k) {
      const StorageOption option = stage.option(k);
      costs.saved[i].push_back(convert(option.saved_bytes));
      costs.forward_tmp[i].push_back(convert(option.forward_tmp_bytes));
      costs.backward_tmp[i].push_back(convert(option.backward_tmp_bytes));
      costs.host[i].push_back(convert_host(option.offloaded_bytes));
      costs.forward_time[i].push_back(chain.forward_all_time(option));
      costs.backward_time[i].push_back(chain.backward_time(option));
    }
  }
  return costs;
}

// Costs in bytes, host included.
inline Costs byte_costs(const Chain& chain) {
  const auto same = [](int64_t bytes) { return bytes; };
  return make_costs(chain, same, same);
}

// A host allowance no chain's host bytes reach (Chain::kMaxTotalBytes bounds their sum): what the
// programs without a host resource pass as the host available, so that every option fits.
constexpr int64_t kUnlimitedHost = std::numeric_limits<int64_t>::max() / 2;

// Case (b), Fall_i kept while i+1..l are reversed, is always allowed unless `restricted`
// (OptimalOptions::forward_all_only_before_backward): then only for the stage's own reverse step
// (l == i), with the loss inside for the last stage.
inline bool forward_all_allowed(bool restricted, int length, int i, int l) {
  return !restricted || l == i || (i == length - 1 && l == length);
}

// The memory case (a) needs for Fck_i Fn_{i+1} ... Fn_{j-1} with δ_{l+1} held, given the
// forward peak of stages i..j-2 (`forward`, updated here for stage j-1); checkpoints x_j. The
// forwards run with the gradients of the stages after l.
inline int64_t forward_input_need(const Costs& c, int i, int j, int l, int64_t& forward) {
  const auto sj = static_cast<size_t>(j);
  if (j - 1 > i) forward = std::max(forward, c.x[sj - 1] + c.x[sj] + c.tmp[sj - 1]);
  return std::max(c.x[static_cast<size_t>(l + 1)] + forward, c.x[sj]) + c.gradients_from(l + 1);
}

// The forward peak of Fck_i alone, where forward_input_need starts.
inline int64_t first_forward(const Costs& c, int i) {
  return c.x[static_cast<size_t>(i + 1)] + c.tmp[static_cast<size_t>(i)];
}

// Case (a)'s terms of the entries starting at i, for each j in (i, L]: the time of Fck_i Fn_{i+1}
// ... Fn_{j-1} (`prefix[j]`) and their forward peak (`forward[j]`, with forward_input_need's
// arithmetic).
inline void fill_forward_input_prefixes(const Costs& c, int i, std::vector<double>& prefix,
                                        std::vector<int64_t>& forward) {
  double time = 0.0;
  int64_t peak = i < c.length ? first_forward(c, i) : 0;
  for (int j = i + 1; j <= c.length; ++j) {
    const auto sj = static_cast<size_t>(j);
    time += c.time[sj - 1];
    if (j - 1 > i) peak = std::max(peak, c.x[sj - 1] + c.x[sj] + c.tmp[sj - 1]);
    prefix[sj] = time;
    forward[sj] = peak;
  }
}

// What a table entry does first: the loss (the chain is done), forward_all of its first stage
// (with a storage option), or forward_input and forward_none up to a later stage j.
enum class Step { Infeasible, Loss, ForwardAll, ForwardInput };

struct Choice {
  Step step = Step::Infeasible;
  int option = 0;
  int j = 0;
};

// The choice of entry (i, l) at memory m and host memory h: its cases evaluated in the order and
// with the arithmetic the solvers build their entries with, so the first minimum is the entry's
// value. `value(i, l, m, h)` reads an entry of shorter interval; `splits(j)` says whether case (a)
// may checkpoint x_j in this entry (see intervals.h). An option whose host memory exceeds h is
// not a choice; Fall_i's host memory is held while i+1..l run.
template <class Value, class Splits>
Choice best_choice(const Costs& c, bool restricted, int i, int l, int64_t m, int64_t h,
                   const Value& value, const Splits& splits) {
  Choice best;
  double best_time = std::numeric_limits<double>::infinity();
  if (i == c.length) {
    if (m >= c.x_at(i)) best.step = Step::Loss;
    return best;
  }
  if (forward_all_allowed(restricted, c.length, i, l)) {
    for (int k = 0; k < c.options(i); ++k) {
      if (m < c.forward_all_need(i, l, k) || c.host_at(i, k) > h) continue;
      const double cost = c.forward_backward_time(i, k);
      const double time =
          l > i ? cost + value(i + 1, l, m - c.saved_at(i, k), h - c.host_at(i, k)) : cost;
      if (time < best_time) {
        best_time = time;
        best = Choice{Step::ForwardAll, k, 0};
      }
    }
  }
  double prefix = 0.0;
  int64_t forward = first_forward(c, i);
  for (int j = i + 1; j <= l; ++j) {
    prefix += c.time[static_cast<size_t>(j - 1)];
    if (m < forward_input_need(c, i, j, l, forward) || !splits(j)) continue;
    const double time = (prefix + value(j, l, m - c.x_at(j), h)) + value(i, j - 1, m, h);
    if (time < best_time) {
      best_time = time;
      best = Choice{Step::ForwardInput, 0, j};
    }
  }
  return best;
}

// Appends the ops of entry (i, l) at memory m and host memory h: `choose(i, l, m, h)` gives each
// entry's Choice, and sub-problems get m and h less what the choice keeps (in `c`'s units).
template <class Choose>
void emit_ops(const Costs& c, int i, int l, int64_t m, int64_t h, const Choose& choose,
              std::vector<Op>& ops) {
  const Choice choice = choose(i, l, m, h);
  switch (choice.step) {
    case Step::Loss:
      ops.push_back({OpKind::Loss, c.length, 0});
      return;
    case Step::ForwardAll:
      ops.push_back({OpKind::ForwardAll, i, choice.option});
      if (l > i) {
        emit_ops(c, i + 1, l, m - c.saved_at(i, choice.option), h - c.host_at(i, choice.option),
                 choose, ops);
      }
      ops.push_back({OpKind::Backward, i, choice.option});
      return;
    case Step::ForwardInput:
      ops.push_back({OpKind::ForwardInput, i, 0});
      for (int k = i + 1; k < choice.j; ++k) ops.push_back({OpKind::ForwardNone, k, 0});
      emit_ops(c, choice.j, l, m - c.x_at(choice.j), h, choose, ops);
      emit_ops(c, i, choice.j - 1, m, h, choose, ops);
      return;
    case Step::Infeasible:
      break;
  }
  throw std::logic_error("ckpt::plan: internal error, no choice for a feasible entry");
}

}  // namespace detail
}  // namespace plan
}  // namespace ckpt
