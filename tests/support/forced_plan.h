#pragma once

// A plan forced on ckpt::PlannedModel: tests that check how one particular choice of storage modes
// runs edit the measurement so that the solver has that choice alone.

#include <ckpt/model_profiler.h>

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace ckpt {
namespace test {

/// An edit of a `MeasuredModel` that leaves each candidate only its option named in `plan`
/// (candidate name -> option name, every candidate listed), so that `PlannedModel::plan` solves to
/// that choice at any budget it fits. Exclusions are dropped: the plan must be a valid choice.
inline std::function<void(MeasuredModel&)> only_plan(std::map<std::string, std::string> plan) {
  return [plan = std::move(plan)](MeasuredModel& measured) {
    for (auto& candidate : measured.profile.candidates) {
      const auto wanted = plan.find(candidate.name);
      ASSERT_NE(wanted, plan.end()) << candidate.name << " is not in the forced plan";
      std::vector<plan::CandidateOption> options{candidate.options.at(0)};
      options[0].time = 1e6;  // slower than any option: the solver takes the wanted one
      for (const auto& option : candidate.options) {
        if (option.name == wanted->second && wanted->second != "stored") options.push_back(option);
      }
      for (auto& option : options) option.excludes.clear();
      ASSERT_EQ(options.size(), wanted->second == "stored" ? 1u : 2u)
          << candidate.name << " has no option " << wanted->second;
      candidate.options = std::move(options);
    }
  };
}

}  // namespace test
}  // namespace ckpt
