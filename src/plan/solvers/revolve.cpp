#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "ckpt/plan/solvers.h"

namespace ckpt {
namespace plan {
namespace {

void check_steps_slots(const char* function, int steps, int slots) {
  if (steps < 1 || slots < 1) {
    throw std::invalid_argument(
        std::string(function) +
        ": steps and slots must both be at least 1, but got steps = " + std::to_string(steps) +
        " and slots = " + std::to_string(slots) + ". The initial state occupies one slot.");
  }
}

// T(l, s) for l in [1, steps], s in [1, slots] with the argmin of the first split, filled by
// increasing l. table[s][l].
struct RevolveTable {
  std::vector<std::vector<int64_t>> cost;
  std::vector<std::vector<int>> split;
};

RevolveTable revolve_table(int steps, int slots) {
  RevolveTable table;
  table.cost.assign(static_cast<size_t>(slots + 1),
                    std::vector<int64_t>(static_cast<size_t>(steps + 1), 0));
  table.split.assign(static_cast<size_t>(slots + 1),
                     std::vector<int>(static_cast<size_t>(steps + 1), 0));
  for (int l = 1; l <= steps; ++l) {
    table.cost[1][static_cast<size_t>(l)] = static_cast<int64_t>(l) * (l - 1) / 2;
    table.split[1][static_cast<size_t>(l)] = l - 1;
  }
  for (int s = 2; s <= slots; ++s) {
    auto& cost = table.cost[static_cast<size_t>(s)];
    const auto& fewer = table.cost[static_cast<size_t>(s - 1)];
    for (int l = 2; l <= steps; ++l) {
      int64_t best = std::numeric_limits<int64_t>::max();
      int best_j = 1;
      for (int j = 1; j < l; ++j) {
        const int64_t candidate =
            j + fewer[static_cast<size_t>(l - j)] + cost[static_cast<size_t>(j)];
        if (candidate < best) {
          best = candidate;
          best_j = j;
        }
      }
      cost[static_cast<size_t>(l)] = best;
      table.split[static_cast<size_t>(s)][static_cast<size_t>(l)] = best_j;
    }
  }
  return table;
}

// Reverses steps (stages) [first, first + count) with `slots` slots, x_first in memory.
void revolve_ops(const RevolveTable& table, int length, int first, int count, int slots,
                 std::vector<Op>& ops) {
  while (count > 1) {
    // s == 1: advance to the last step without storing anything (T(l,1) = l-1 + T(l-1,1)).
    const int j = table.split[static_cast<size_t>(slots)][static_cast<size_t>(count)];
    ops.push_back({OpKind::ForwardInput, first, 0});
    for (int i = first + 1; i < first + j; ++i) ops.push_back({OpKind::ForwardNone, i, 0});
    revolve_ops(table, length, first + j, count - j, slots == 1 ? 1 : slots - 1, ops);
    count = j;
  }
  // The reverse step re-runs its own forward, taped; the last one holds the loss.
  ops.push_back({OpKind::ForwardAll, first, 0});
  if (first == length - 1) ops.push_back({OpKind::Loss, length, 0});
  ops.push_back({OpKind::Backward, first, 0});
}

}  // namespace

int64_t revolve_forward_count(int steps, int slots) {
  check_steps_slots("ckpt::plan::revolve_forward_count", steps, slots);
  if (slots >= steps) return steps - 1;
  // beta(s, r) = C(s + r, s); find the smallest r with beta(s, r) >= l.
  const int64_t l = steps;
  const int64_t s = slots;
  int64_t r = 0;
  int64_t beta = 1;  // C(s + 0, s)
  while (beta < l) {
    ++r;
    beta = beta * (s + r) / r;  // C(s + r, s) = C(s + r - 1, s) * (s + r) / r, exact
  }
  // C(s + r, s + 1) = C(s + r, s) * r / (s + 1), exact.
  return r * l - beta * r / (s + 1);
}

int64_t revolve_forward_count_dp(int steps, int slots) {
  check_steps_slots("ckpt::plan::revolve_forward_count_dp", steps, slots);
  slots = std::min(slots, steps);
  return revolve_table(steps, slots).cost[static_cast<size_t>(slots)][static_cast<size_t>(steps)];
}

Schedule solve_revolve(const Chain& chain, int slots) {
  chain.validate();
  if (slots < 1) {
    throw std::invalid_argument(
        "ckpt::plan::solve_revolve: slots must be at least 1 (x_0 occupies one), but got " +
        std::to_string(slots) + ". Pass the number of activations that may be stored.");
  }
  const int length = chain.size();
  const int steps = length;  // the loss belongs to the reverse step of the last stage
  slots = std::min(slots, steps);
  const RevolveTable table = revolve_table(steps, slots);
  Schedule schedule;
  revolve_ops(table, length, 0, steps, slots, schedule.ops);
  return schedule;
}

}  // namespace plan
}  // namespace ckpt
