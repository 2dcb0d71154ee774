// Do non-persistent schedules pay? (issue 12, item 2)
//
// ckpt's solvers search persistent schedules (rotor's model): an x̄_i, once computed, stays until
// its backward, and a checkpoint stays until its backward too. Later work (rotor's journal version,
// Checkmate) drops that rule: anything may be freed at any time and recomputed later. This program
// finds the fastest schedule of either kind by a shortest-path search over the simulator's states,
// on chains small enough for it, and prints the gain of dropping the rule:
//   - random heterogeneous chains of 6 stages, every budget from the minimum to the plain peak;
//   - the bench models (mlp, resnet, transformer, profiled here), grouped into 8 stages.
// It first checks its own accounting: with the persistent rule it must equal solve_exact, the
// byte-exact persistent optimum, at every budget (it stops with an error otherwise).
//
// usage: nonpersistent_study [--quick]

#include "bench_models.h"

#include <ckpt/plan/chain.h>
#include <ckpt/plan/simulator.h>
#include <ckpt/plan/solvers.h>
#include <ckpt/profiler.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <queue>
#include <random>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

using ckpt::plan::Chain;
using ckpt::plan::Stage;

// A state of the simulator (docs/memory-model.md, "State"), option 0 only: standalone x_i, kept
// marks, x̄_i, and the phase (before the loss, or the index j of the one gradient δ_j alive).
struct State {
  uint32_t standalone = 1;  // bit i: a standalone x_i (x_0 always)
  uint32_t kept = 1;        // bit i: that x_i is a checkpoint (persistent rule only)
  uint32_t full = 0;        // bit i: x̄_i (the graph of stage i-1)
  int phase = -1;           // -1: before the loss; j: δ_j alive, stages >= j backwarded
};

class Search {
 public:
  Search(const Chain& chain, bool persistent) : chain_(chain), persistent_(persistent) {
    if (chain.size() > 10) throw std::invalid_argument("the search is for at most 10 stages");
    phases_ = chain.size() + 2;
  }

  // The fastest schedule's time within `budget`, or infinity.
  double fastest(int64_t budget) const {
    std::unordered_map<size_t, double> time;  // the states reached, with their best time
    using Entry = std::pair<double, size_t>;
    std::priority_queue<Entry, std::vector<Entry>, std::greater<>> queue;
    const State start;
    if (current(start) > budget) return kInfinity;
    time[index(start)] = 0;
    queue.push({0.0, index(start)});
    while (!queue.empty()) {
      const auto [t, at] = queue.top();
      queue.pop();
      if (t > time.at(at)) continue;
      const State s = state(at);
      if (s.phase == 0) return t;  // every stage backwarded
      for_each_move(s, budget, [&](const State& next, double cost) {
        const size_t to = index(next);
        const auto found = time.find(to);
        if (found == time.end() || t + cost < found->second) {
          time[to] = t + cost;
          queue.push({t + cost, to});
        }
      });
    }
    return kInfinity;
  }

  static constexpr double kInfinity = std::numeric_limits<double>::infinity();

 private:
  int64_t x(int i) const { return chain_.activation_bytes(i); }
  bool has(uint32_t bits, int i) const { return (bits >> i) & 1u; }
  bool available(const State& s, int i) const { return has(s.standalone, i) || has(s.full, i); }
  bool backwarded(const State& s, int stage) const { return s.phase >= 0 && stage >= s.phase; }

  int64_t current(const State& s) const {
    int64_t bytes = 0;
    for (int i = 0; i <= chain_.size(); ++i) {
      if (has(s.standalone, i)) bytes += x(i);
      if (i > 0 && has(s.full, i)) bytes += chain_.stages[i - 1].saved_bytes;
    }
    return bytes + (s.phase >= 0 ? x(s.phase) : 0);
  }

  // Every operation allowed from `s` within the budget: the simulator's (forward_none,
  // forward_input, forward_all, loss, backward), plus, without the persistent rule, freeing at
  // any time a standalone x_i (i >= 1) or an x̄_i (keeping its output x_i, or not), but never an
  // x_i that the graph of stage i still holds.
  template <class Visit>
  void for_each_move(const State& s, int64_t budget, Visit visit) const {
    const int64_t now = current(s);
    forward_moves(s, budget, now, visit);
    loss_and_backward_moves(s, budget, now, visit);
    if (!persistent_) freeing_moves(s, visit);
  }

  // forward_input, forward_none (persistent only) and forward_all of every stage that can run.
  template <class Visit>
  void forward_moves(const State& s, int64_t budget, int64_t now, Visit& visit) const {
    for (int i = 0; i < chain_.size(); ++i) {
      const Stage& st = chain_.stages[i];
      if (backwarded(s, i) || !available(s, i) || available(s, i + 1)) continue;
      const int64_t all_tmp =
          st.forward_all_tmp_bytes >= 0 ? st.forward_all_tmp_bytes : st.forward_tmp_bytes;
      const double all_time = st.forward_all_time >= 0 ? st.forward_all_time : st.forward_time;
      if (now + x(i + 1) + st.forward_tmp_bytes <= budget) {
        State keep = s;  // forward_input
        keep.standalone |= 1u << (i + 1);
        if (persistent_ && has(s.standalone, i)) keep.kept |= 1u << i;
        visit(keep, st.forward_time);
        if (persistent_) {  // forward_none frees a standalone x_i that is no checkpoint
          State none = s;
          none.standalone |= 1u << (i + 1);
          if (has(s.standalone, i) && !has(s.kept, i)) none.standalone &= ~(1u << i);
          visit(none, st.forward_time);
        }
      }
      if (now + st.saved_bytes + all_tmp <= budget) {
        State all = s;
        all.full |= 1u << (i + 1);
        visit(all, all_time);
      }
    }
  }

  // The loss once the last output is there, then the one backward that can run next.
  template <class Visit>
  void loss_and_backward_moves(const State& s, int64_t budget, int64_t now, Visit& visit) const {
    const int n = chain_.size();
    if (s.phase < 0 && available(s, n) && now + x(n) <= budget) {
      State loss = s;
      loss.phase = n;
      loss.standalone &= ~(1u << n);
      loss.kept &= ~(1u << n);
      visit(loss, 0.0);
    }
    const int i = s.phase - 1;
    if (i >= 0 && has(s.full, i + 1) && available(s, i) &&
        now + x(i) + chain_.stages[i].backward_tmp_bytes <= budget) {
      State back = s;
      back.phase = i;
      back.full &= ~(1u << (i + 1));
      if (i >= 1) {
        back.standalone &= ~(1u << i);
        back.kept &= ~(1u << i);
      }
      visit(back, chain_.stages[i].backward_time);
    }
  }

  // Without the persistent rule: freeing a standalone x_k or a graph x̄_k at any time. Stage k's
  // graph (x̄_{k+1}) holds its input x_k: while it lives, x_k's memory cannot go.
  template <class Visit>
  void freeing_moves(const State& s, Visit& visit) const {
    const int n = chain_.size();
    for (int k = 1; k <= n; ++k) {
      const bool input_held = k < n && has(s.full, k + 1);
      if (has(s.standalone, k) && !input_held) {
        State dropped = s;
        dropped.standalone &= ~(1u << k);
        visit(dropped, 0.0);
      }
      if (has(s.full, k)) {
        State dropped = s;  // the graph of stage k-1 goes; its output x_k stays, or goes too
        dropped.full &= ~(1u << k);
        dropped.standalone |= 1u << k;
        visit(dropped, 0.0);
        if (!input_held) {
          dropped.standalone &= ~(1u << k);
          visit(dropped, 0.0);
        }
      }
    }
  }

  size_t index(const State& s) const {
    const int n = chain_.size();
    size_t code = s.standalone | (static_cast<size_t>(s.full) << (n + 1));
    if (persistent_) code |= static_cast<size_t>(s.kept) << (2 * n + 2);
    return code * static_cast<size_t>(phases_) + static_cast<size_t>(s.phase + 1);
  }
  State state(size_t code) const {
    const int n = chain_.size();
    State s;
    s.phase = static_cast<int>(code % static_cast<size_t>(phases_)) - 1;
    code /= static_cast<size_t>(phases_);
    s.standalone = static_cast<uint32_t>(code & ((1u << (n + 1)) - 1));
    s.full = static_cast<uint32_t>((code >> (n + 1)) & ((1u << (n + 1)) - 1));
    s.kept = persistent_ ? static_cast<uint32_t>(code >> (2 * n + 2)) : 0u;
    return s;
  }

  const Chain& chain_;
  bool persistent_;
  int phases_ = 0;
};

// Only option 0 of each stage: the search does not branch on storage options.
Chain option_zero(Chain chain) {
  for (Stage& stage : chain.stages) stage.alternatives.clear();
  return chain;
}

// Consecutive stages merged into `groups` stages: times add up, the group keeps what its members
// keep, its temporaries are the largest member's. A coarse chain to search on; both kinds of
// schedule are compared on the same one.
Chain grouped(const Chain& chain, int groups) {
  Chain out;
  out.input_bytes = chain.input_bytes;
  const int n = chain.size();
  for (int g = 0; g < groups; ++g) {
    const int first = n * g / groups, end = n * (g + 1) / groups;
    Stage merged;
    merged.forward_all_time = 0;
    merged.forward_all_tmp_bytes = 0;
    for (int i = first; i < end; ++i) {
      const Stage& st = chain.stages[i];
      merged.forward_time += st.forward_time;
      merged.forward_all_time += st.forward_all_time >= 0 ? st.forward_all_time : st.forward_time;
      merged.backward_time += st.backward_time;
      merged.saved_bytes += st.saved_bytes;
      merged.output_bytes = st.output_bytes;
      merged.forward_tmp_bytes = std::max(merged.forward_tmp_bytes, st.forward_tmp_bytes);
      merged.forward_all_tmp_bytes =
          std::max(merged.forward_all_tmp_bytes,
                   st.forward_all_tmp_bytes >= 0 ? st.forward_all_tmp_bytes : st.forward_tmp_bytes);
      merged.backward_tmp_bytes = std::max(merged.backward_tmp_bytes, st.backward_tmp_bytes);
    }
    out.stages.push_back(merged);
  }
  return out;
}

Chain random_chain(std::mt19937& rng, int stages) {
  std::uniform_int_distribution<int64_t> size(1, 64), tmp(0, 32);
  std::uniform_real_distribution<double> time(0.5, 4.0);
  Chain chain;
  chain.input_bytes = size(rng);
  for (int i = 0; i < stages; ++i) {
    Stage st;
    st.forward_time = time(rng);
    st.forward_all_time = st.forward_time * 1.1;
    st.backward_time = 2 * st.forward_time;
    st.output_bytes = size(rng);
    st.saved_bytes = st.output_bytes + 2 * size(rng);
    st.forward_tmp_bytes = tmp(rng);
    st.backward_tmp_bytes = tmp(rng);
    chain.stages.push_back(st);
  }
  return chain;
}

struct Gains {
  int pairs = 0, better = 0;
  double worst = 0, sum = 0;  // largest and total relative gain of non-persistent
  int lower_minimum = 0;      // chains whose smallest feasible budget non-persistent lowers
};

// Every budget from the persistent minimum to the plain peak, in `points` steps (or every byte of
// a small chain): the persistent search checked against solve_exact, then the gain.
void compare(const Chain& chain, int points, Gains& gains, const char* name) {
  const int64_t low = ckpt::plan::min_feasible_budget_bytes(chain);
  const int64_t high =
      ckpt::plan::simulate(chain, ckpt::plan::solve_no_checkpoint(chain)).peak_bytes;
  const Search persistent(chain, true), general(chain, false);
  if (general.fastest(low - 1) < Search::kInfinity) ++gains.lower_minimum;
  for (int k = 0; k < points; ++k) {
    const int64_t budget = low + (high - low) * k / std::max(points - 1, 1);
    const auto exact = ckpt::plan::solve_exact(chain, budget, int64_t{1} << 40);
    const double exact_time = ckpt::plan::simulate(chain, exact.schedule.value()).time;
    const double searched = persistent.fastest(budget);
    if (std::abs(searched - exact_time) > 1e-9 * exact_time) {
      throw std::runtime_error(std::string(name) + ": the persistent search gives " +
                               std::to_string(searched) + ", solve_exact " +
                               std::to_string(exact_time) + " at budget " + std::to_string(budget));
    }
    const double best = general.fastest(budget);
    const double gain = 1.0 - best / searched;
    ++gains.pairs;
    if (gain > 1e-9) ++gains.better;
    gains.worst = std::max(gains.worst, gain);
    gains.sum += gain;
  }
}

void report(const char* name, const Gains& g) {
  std::printf("| %s | %d | %d (%.1f%%) | %.2f%% | %.3f%% | %d |\n", name, g.pairs, g.better,
              100.0 * g.better / std::max(g.pairs, 1), 100 * g.worst,
              100 * g.sum / std::max(g.pairs, 1), g.lower_minimum);
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  CLI::App app{
      "Do non-persistent schedules beat the persistent optimum? A shortest-path search "
      "over the simulator's states, on random chains and the grouped bench models",
      "nonpersistent_study"};
  app.add_flag("--quick", quick, "fewer random chains and the small bench models (a smoke test)");
  CLI11_PARSE(app, argc, argv);
  std::printf(
      "| chains | pairs | non-persistent faster | largest gain | mean gain | "
      "chains with a lower minimum |\n|---|---:|---:|---:|---:|---:|\n");
  std::mt19937 rng(12);
  Gains random;
  for (int c = 0; c < (quick ? 5 : 40); ++c) {
    compare(random_chain(rng, 6), 24, random, "random chain");
  }
  report("random, 6 stages", random);
  for (const std::string name : {"mlp", "resnet", "transformer"}) {
    const auto config = ckpt::models::model_config(name, quick);
    auto model = ckpt::models::build_model(config);
    const std::vector<torch::nn::AnyModule> stages(model->begin(), model->end());
    const Chain profile = ckpt::profile_chain(stages, ckpt::models::make_input(config),
                                              ckpt::ProfileOptions().repeats(quick ? 1 : 3));
    Gains gains;
    compare(option_zero(grouped(profile, std::min(8, profile.size()))), 40, gains, name.c_str());
    report((name + ", 8 groups").c_str(), gains);
  }
  return 0;
}
