#pragma once

// A plan forced on ckpt::PlannedModel: tests that check how one particular choice of storage modes
// runs edit the measurement so that the solver has that choice alone.

#include <ckpt/model_profiler.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <random>
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

/// A choice of one option per candidate, at random among those that no option chosen before
/// excludes or is excluded by (empty where a candidate is left none).
inline std::vector<int> random_valid_choice(const plan::ModelProfile& profile,
                                            std::mt19937& random) {
  std::vector<int> choice;
  const auto excludes = [&](size_t c, int o, size_t d, int p) {
    const auto& listed = profile.candidates[c].options[static_cast<size_t>(o)].excludes;
    return std::any_of(listed.begin(), listed.end(), [&](const plan::OptionRef& ref) {
      return ref.candidate == static_cast<int>(d) && ref.option == p;
    });
  };
  for (size_t c = 0; c < profile.candidates.size(); ++c) {
    std::vector<int> allowed;
    for (int o = 0; o < static_cast<int>(profile.candidates[c].options.size()); ++o) {
      bool fits = true;
      for (size_t d = 0; d < c; ++d)
        fits = fits && !excludes(c, o, d, choice[d]) && !excludes(d, choice[d], c, o);
      if (fits) allowed.push_back(o);
    }
    if (allowed.empty()) return {};
    choice.push_back(allowed[random() % allowed.size()]);
  }
  return choice;
}

/// `measured` with every option timed so that the solver picks `choice` (one option per
/// candidate, a valid one) at any budget it fits: 0 seconds for the chosen options, 1e6 for the
/// others.
inline MeasuredModel forced_choice(MeasuredModel measured, const std::vector<int>& choice) {
  for (size_t c = 0; c < choice.size(); ++c) {
    auto& options = measured.profile.candidates[c].options;
    for (size_t o = 0; o < options.size(); ++o)
      options[o].time = static_cast<int>(o) == choice[c] ? 0.0 : 1e6;
  }
  return measured;
}

}  // namespace test
}  // namespace ckpt
