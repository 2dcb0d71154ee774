// Long chains: rotor's table on a chain of groups of consecutive stages, expanded back to the
// stages and checked on the real chain by the simulator. docs/memory-model.md, "Long chains".

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/plan/simulator.h"
#include "ckpt/plan/solvers.h"
#include "min_memory.h"

namespace ckpt {
namespace plan {
namespace {

// Group g holds stages [first[g], first[g + 1]).
std::vector<int> group_borders(int length, int groups) {
  std::vector<int> first;
  for (int g = 0; g <= groups; ++g) {
    first.push_back(static_cast<int>(static_cast<int64_t>(length) * g / groups));
  }
  return first;
}

// A group as one stage with full storage option 0 of each member. Its sizes estimate the
// members' peaks (the simulator checks the expanded schedule exactly, so they need not be exact);
// a group of one stage is that stage.
Stage group_stage(const Chain& chain, int first, int end) {
  Stage group;
  int64_t saved = 0, forward_tmp = 0, forward_all_tmp = 0, backward_tmp = 0;
  double forward_all_time = 0.0;
  const int64_t outer = chain.activation_bytes(first) + chain.activation_bytes(end);
  for (int i = first; i < end; ++i) {
    const Stage& stage = chain.stages[static_cast<size_t>(i)];
    const StorageOption full = stage.option(0);
    group.forward_time += stage.forward_time;
    forward_all_time += full.forward_time;
    group.backward_time += full.backward_time;
    saved += full.saved_bytes;
    // A no-grad forward holds x_i, x_{i+1} and the stage's temporaries.
    forward_tmp = std::max(forward_tmp, chain.activation_bytes(i) + stage.output_bytes +
                                            stage.forward_tmp_bytes - outer);
    forward_all_tmp = std::max(forward_all_tmp, full.forward_tmp_bytes);
    // Inside the group, the backward also holds the gradient of the member's input, and the
    // parameter gradients of the members after it (backwarded before it).
    const int64_t inner_gradient = i > first ? chain.activation_bytes(i) : 0;
    int64_t later_parameters = 0;
    for (int j = i + 1; j < end; ++j) {
      later_parameters += chain.stages[static_cast<size_t>(j)].gradient_bytes;
    }
    backward_tmp =
        std::max(backward_tmp, full.backward_tmp_bytes + inner_gradient + later_parameters);
    group.gradient_bytes += stage.gradient_bytes;
  }
  group.output_bytes = chain.activation_bytes(end);
  group.saved_bytes = std::max(saved, group.output_bytes);
  group.forward_tmp_bytes = std::max<int64_t>(forward_tmp, 0);
  group.forward_all_tmp_bytes = forward_all_tmp;
  group.forward_all_time = forward_all_time;
  group.backward_tmp_bytes = backward_tmp;
  return group;
}

Schedule expand(const Schedule& grouped, const std::vector<int>& first, int length) {
  Schedule schedule;
  for (const Op& op : grouped.ops) {
    if (op.kind == OpKind::Loss) {
      schedule.ops.push_back({OpKind::Loss, length, 0});
      continue;
    }
    const int begin = first[static_cast<size_t>(op.stage)];
    const int end = first[static_cast<size_t>(op.stage) + 1];
    switch (op.kind) {
      case OpKind::ForwardNone:
      case OpKind::ForwardInput:
        schedule.ops.push_back({op.kind, begin, 0});
        for (int i = begin + 1; i < end; ++i) schedule.ops.push_back({OpKind::ForwardNone, i, 0});
        break;
      case OpKind::ForwardAll:
        for (int i = begin; i < end; ++i) schedule.ops.push_back({OpKind::ForwardAll, i, 0});
        break;
      default:
        for (int i = end - 1; i >= begin; --i) schedule.ops.push_back({OpKind::Backward, i, 0});
    }
  }
  return schedule;
}

}  // namespace

std::optional<Schedule> solve_grouped(const Chain& chain, int64_t budget_bytes, int groups,
                                      const OptimalOptions& options) {
  chain.validate();
  if (groups < 1) {
    throw std::invalid_argument("ckpt::plan::solve_grouped: groups must be at least 1, but got " +
                                std::to_string(groups) + ".");
  }
  return detail::solve_grouped(
      chain, budget_bytes, groups, options,
      detail::min_memory_plan("ckpt::plan::solve_grouped", chain, options));
}

namespace detail {

std::optional<Schedule> solve_grouped(const Chain& chain, int64_t budget_bytes, int groups,
                                      const OptimalOptions& options, MinMemoryPlan smallest) {
  groups = std::min(groups, chain.size());
  if (budget_bytes < smallest.memory) return std::nullopt;
  // The two ends first: storing everything, when it fits, is the fastest option-0 schedule.
  Schedule all = solve_no_checkpoint(chain);
  const SimulationResult all_result = simulate(chain, all);
  if (all_result.valid && all_result.peak_bytes <= budget_bytes) return all;
  Schedule best = std::move(smallest.schedule);
  double best_time = simulate(chain, best).time;

  const std::vector<int> first = group_borders(chain.size(), groups);
  Chain grouped;
  grouped.input_bytes = chain.input_bytes;
  for (int g = 0; g < groups; ++g) {
    grouped.stages.push_back(
        group_stage(chain, first[static_cast<size_t>(g)], first[static_cast<size_t>(g) + 1]));
  }
  // Group sizes count some activations twice, so near Chain::kMaxTotalBytes the grouped chain
  // can pass the limit: the two exact ends are the answer then.
  try {
    grouped.validate();
  } catch (const std::invalid_argument&) {
    return best;
  }
  // The group sizes are estimates: ask the grouped table for smaller budgets until the expanded
  // schedule fits on the real chain (the fastest that fits, with the largest budget that does).
  const OptimalTable table(grouped, std::max(budget_bytes, grouped.input_bytes), options);
  detail::search_asks(
      chain, budget_bytes, table.min_feasible_budget_bytes(), budget_bytes,
      [&](int64_t asked) -> std::optional<Schedule> {
        const std::optional<Schedule> schedule = table.solve(asked);
        if (!schedule) return std::nullopt;
        return expand(*schedule, first, chain.size());
      },
      best, best_time);
  return best;
}

}  // namespace detail
}  // namespace plan
}  // namespace ckpt
