// The planner's model of any network: a profile's checks and the simulator of a choice.
// docs/memory-model.md, "Any model".

#include "ckpt/plan/model.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "solvers/model_problem.h"

namespace ckpt {
namespace plan {
namespace {

std::string where(const Candidate& candidate, size_t index) {
  return "candidate " + std::to_string(index) + " ('" + candidate.name + "')";
}

bool valid_time(double seconds) {
  return std::isfinite(seconds) && seconds >= 0.0;
}

std::string where(const Candidate& candidate, size_t index, size_t o) {
  return where(candidate, index) + " option " + std::to_string(o) + " ('" +
         candidate.options[o].name + "')";
}

void validate_option(const Candidate& candidate, size_t index, size_t o, int segments) {
  const CandidateOption& option = candidate.options[o];
  const auto what = [&] { return where(candidate, index, o); };
  if (!valid_time(option.time)) {
    throw std::invalid_argument("ckpt::plan::ModelProfile: " + what() + " has time " +
                                std::to_string(option.time) +
                                "; times must be finite seconds, not negative");
  }
  if (option.host_bytes < 0) {
    throw std::invalid_argument("ckpt::plan::ModelProfile: " + what() + " has negative host_bytes");
  }
  const int64_t end = candidate.window_begin + static_cast<int64_t>(option.peak_delta.size());
  if (end > segments) {
    throw std::invalid_argument("ckpt::plan::ModelProfile: " + what() +
                                " has deltas up to segment " + std::to_string(end - 1) +
                                " but the timeline has " + std::to_string(segments) +
                                " segments; shorten peak_delta or move window_begin");
  }
  if (option.fetched_bytes < 0) {
    throw std::invalid_argument("ckpt::plan::ModelProfile: " + what() +
                                " has negative fetched_bytes");
  }
  const bool changes = std::any_of(option.peak_delta.begin(), option.peak_delta.end(),
                                   [](int64_t delta) { return delta != 0; });
  if (o == 0 && (changes || option.host_bytes != 0 || option.fetched_bytes != 0)) {
    throw std::invalid_argument("ckpt::plan::ModelProfile: " + what() +
                                " is option 0, the stored mode: its deltas, host_bytes and "
                                "fetched_bytes must be zero (the other options are measured "
                                "relative to it)");
  }
}

// Option o of candidate `index` excludes only existing options of other candidates, and option 0
// none: the all-stored choice must stay valid.
void validate_exclusions(const ModelProfile& profile, size_t index, size_t o) {
  const Candidate& candidate = profile.candidates[index];
  const auto what = [&] { return "ckpt::plan::ModelProfile: " + where(candidate, index, o); };
  if (o == 0 && !candidate.options[0].excludes.empty()) {
    throw std::invalid_argument(what() +
                                " is option 0, the stored mode: it must combine with every "
                                "option, so that storing everything is always a valid choice; "
                                "list the exclusion on the other option instead");
  }
  const int candidates = static_cast<int>(profile.candidates.size());
  for (const OptionRef& ref : candidate.options[o].excludes) {
    if (ref.candidate < 0 || ref.candidate >= candidates) {
      throw std::invalid_argument(what() + " excludes candidate " + std::to_string(ref.candidate) +
                                  ", but the profile has " + std::to_string(candidates) +
                                  " candidates; name an index in [0, " +
                                  std::to_string(candidates) + ")");
    }
    if (static_cast<size_t>(ref.candidate) == index) {
      throw std::invalid_argument(what() +
                                  " excludes an option of its own candidate; a choice picks one "
                                  "option per candidate anyway: drop that exclusion");
    }
    const Candidate& other = profile.candidates[static_cast<size_t>(ref.candidate)];
    const int options = static_cast<int>(other.options.size());
    if (ref.option < 0 || ref.option >= options) {
      throw std::invalid_argument(what() + " excludes option " + std::to_string(ref.option) +
                                  " of " + where(other, static_cast<size_t>(ref.candidate)) +
                                  ", which has " + std::to_string(options) +
                                  " options; name an index in [0, " + std::to_string(options) +
                                  ")");
    }
  }
}

void validate_candidate(const Candidate& candidate, size_t index, int segments) {
  if (candidate.options.empty()) {
    throw std::invalid_argument("ckpt::plan::ModelProfile: " + where(candidate, index) +
                                " has no options; give it at least option 0, \"stored\"");
  }
  if (candidate.window_begin < 0 || candidate.window_begin > segments) {
    throw std::invalid_argument("ckpt::plan::ModelProfile: " + where(candidate, index) +
                                " has window_begin " + std::to_string(candidate.window_begin) +
                                " outside the timeline's " + std::to_string(segments) +
                                " segments");
  }
  if (candidate.backward_segment < -1 || candidate.backward_segment >= segments) {
    throw std::invalid_argument("ckpt::plan::ModelProfile: " + where(candidate, index) +
                                " has backward_segment " +
                                std::to_string(candidate.backward_segment) + " outside the " +
                                "timeline's " + std::to_string(segments) + " segments (-1: none)");
  }
  for (size_t o = 0; o < candidate.options.size(); ++o) {
    validate_option(candidate, index, o, segments);
  }
}

void check_choice(const ModelProfile& profile, const std::vector<int>& choice) {
  if (choice.size() != profile.candidates.size()) {
    throw std::invalid_argument("ckpt::plan::simulate_model: the choice has " +
                                std::to_string(choice.size()) + " entries but the profile has " +
                                std::to_string(profile.candidates.size()) +
                                " candidates; give one option index per candidate");
  }
  for (size_t c = 0; c < choice.size(); ++c) {
    const size_t options = profile.candidates[c].options.size();
    if (choice[c] < 0 || static_cast<size_t>(choice[c]) >= options) {
      throw std::invalid_argument("ckpt::plan::simulate_model: option " +
                                  std::to_string(choice[c]) + " of " +
                                  where(profile.candidates[c], c) + " is out of range [0, " +
                                  std::to_string(options) + ")");
    }
  }
  if (const auto conflict = detail::first_conflict(profile, choice)) {
    const size_t c = static_cast<size_t>(conflict->candidate);
    const size_t d = static_cast<size_t>(conflict->excluded.candidate);
    throw std::invalid_argument(
        "ckpt::plan::simulate_model: " +
        where(profile.candidates[c], c, static_cast<size_t>(conflict->option)) + " excludes " +
        where(profile.candidates[d], d, static_cast<size_t>(conflict->excluded.option)) +
        ", but the choice picks both; choose another option for one of them");
  }
}

// The option `choice` picks for candidate c.
const CandidateOption& chosen(const ModelProfile& profile, const std::vector<int>& choice,
                              size_t c) {
  return profile.candidates[c].options[static_cast<size_t>(choice[c])];
}

// Each entry of `look_ahead` is -1 or another candidate whose chosen option fetches data, and
// whose backward begins after this one's.
void check_look_ahead(const ModelProfile& profile, const std::vector<int>& choice,
                      const std::vector<int>& look_ahead) {
  if (look_ahead.empty()) return;
  const auto fail = [](const std::string& what) {
    throw std::invalid_argument("ckpt::plan::simulate_model: " + what);
  };
  if (look_ahead.size() != choice.size()) {
    fail("the look-ahead has " + std::to_string(look_ahead.size()) + " entries for " +
         std::to_string(choice.size()) + " candidates; give one per candidate (-1: none)");
  }
  const int candidates = static_cast<int>(choice.size());
  for (size_t c = 0; c < look_ahead.size(); ++c) {
    const int ahead = look_ahead[c];
    if (ahead == -1) continue;
    const Candidate& lead = profile.candidates[c];
    if (ahead < 0 || ahead >= candidates || static_cast<size_t>(ahead) == c) {
      fail(where(lead, c) + " brings back candidate " + std::to_string(ahead) +
           "; name another candidate in [0, " + std::to_string(candidates) + "), or -1");
    }
    const Candidate& back = profile.candidates[static_cast<size_t>(ahead)];
    if (chosen(profile, choice, static_cast<size_t>(ahead)).fetched_bytes == 0) {
      fail(where(lead, c) + " brings back " + where(back, static_cast<size_t>(ahead)) +
           ", whose chosen option fetches nothing");
    }
    if (lead.backward_segment < 0 || back.backward_segment <= lead.backward_segment) {
      fail(where(lead, c) + " brings back " + where(back, static_cast<size_t>(ahead)) +
           ", whose backward does not begin after its own");
    }
  }
}

// The bytes of each segment under `choice` (and `look_ahead`, checked).
std::vector<int64_t> segment_bytes(const ModelProfile& profile, const std::vector<int>& choice,
                                   const std::vector<int>& look_ahead) {
  std::vector<int64_t> bytes = profile.segment_peak_bytes;
  for (size_t c = 0; c < choice.size(); ++c) {
    const Candidate& candidate = profile.candidates[c];
    const CandidateOption& option = chosen(profile, choice, c);
    for (size_t i = 0; i < option.peak_delta.size(); ++i) {
      bytes[static_cast<size_t>(candidate.window_begin) + i] += option.peak_delta[i];
    }
    if (look_ahead.empty() || look_ahead[c] < 0) continue;
    const auto ahead = static_cast<size_t>(look_ahead[c]);
    for (int k = candidate.backward_segment; k < profile.candidates[ahead].backward_segment; ++k) {
      bytes[static_cast<size_t>(k)] += chosen(profile, choice, ahead).fetched_bytes;
    }
  }
  return bytes;
}

}  // namespace

OptionRun OptionRun::in_mode(std::string mode, bool takers_kept, bool parts_checkpointed) {
  OptionRun run;
  run.mode = std::move(mode);
  run.takers_kept = takers_kept;
  run.parts_checkpointed = parts_checkpointed;
  return run;
}

OptionRun OptionRun::recomputed(int chain_length, bool skips_kept) {
  OptionRun run = in_mode("checkpointed");
  run.outputs_recomputed = true;
  run.chain_length = std::max(chain_length, 1);
  run.skips_kept = skips_kept;
  return run;
}

std::string OptionRun::name() const {
  if (outputs_recomputed) {
    const std::string chain =
        chain_length <= 1 ? "recomputed" : "recomputed, chain of " + std::to_string(chain_length);
    return skips_kept ? chain + ", skips kept" : chain;
  }
  std::string base = mode.empty() ? "stored" : mode;
  if (parts_checkpointed) base += ", parts checkpointed";
  if (producers_let_go) base += ", producers let go";
  return takers_kept ? base + ", takers kept" : base;
}

namespace detail {

std::optional<ModelConflict> first_conflict(const ModelProfile& profile,
                                            const std::vector<int>& choice) {
  for (size_t c = 0; c < choice.size(); ++c) {
    const CandidateOption& option = profile.candidates[c].options[static_cast<size_t>(choice[c])];
    for (const OptionRef& ref : option.excludes) {
      if (choice[static_cast<size_t>(ref.candidate)] == ref.option) {
        return ModelConflict{static_cast<int>(c), choice[c], ref};
      }
    }
  }
  return std::nullopt;
}

}  // namespace detail

int64_t ModelProfile::plain_peak_bytes() const {
  if (segment_peak_bytes.empty()) return 0;
  return *std::max_element(segment_peak_bytes.begin(), segment_peak_bytes.end());
}

void ModelProfile::validate() const {
  if (segment_labels.size() != segment_peak_bytes.size()) {
    throw std::invalid_argument(
        "ckpt::plan::ModelProfile: " + std::to_string(segment_labels.size()) +
        " segment labels for " + std::to_string(segment_peak_bytes.size()) +
        " segments; give one label per segment");
  }
  if (!valid_time(step_time)) {
    throw std::invalid_argument("ckpt::plan::ModelProfile: step_time " + std::to_string(step_time) +
                                " is not a finite, non-negative number of seconds");
  }
  const int segments = static_cast<int>(segment_peak_bytes.size());
  for (size_t c = 0; c < candidates.size(); ++c) validate_candidate(candidates[c], c, segments);
  // After every candidate's own checks: an exclusion may name any of them.
  for (size_t c = 0; c < candidates.size(); ++c) {
    for (size_t o = 0; o < candidates[c].options.size(); ++o) validate_exclusions(*this, c, o);
  }
}

ModelPrediction simulate_model(const ModelProfile& profile, const std::vector<int>& choice,
                               const std::vector<int>& look_ahead) {
  profile.validate();
  check_choice(profile, choice);
  check_look_ahead(profile, choice, look_ahead);
  ModelPrediction prediction;
  prediction.time = profile.step_time;
  for (size_t c = 0; c < choice.size(); ++c) {
    const CandidateOption& option = chosen(profile, choice, c);
    prediction.time += option.time - profile.candidates[c].options[0].time;
    prediction.host_bytes += option.host_bytes;
  }
  const std::vector<int64_t> peak = segment_bytes(profile, choice, look_ahead);
  if (!peak.empty()) {
    const auto highest = std::max_element(peak.begin(), peak.end());  // the first such
    prediction.peak_bytes = *highest;
    prediction.peak_segment = static_cast<int>(highest - peak.begin());
  }
  return prediction;
}

ModelPlan add_look_ahead(const ModelProfile& profile, ModelPlan plan, int64_t budget_bytes) {
  if (!plan.feasible) return plan;
  const std::vector<int>& choice = plan.choice;
  const int64_t limit = std::max(budget_bytes, plan.prediction.peak_bytes);
  // Candidates by where their backward begins: each brings back the one after it.
  std::vector<int> by_backward;
  for (size_t c = 0; c < choice.size(); ++c) {
    if (profile.candidates[c].backward_segment >= 0) by_backward.push_back(static_cast<int>(c));
  }
  std::stable_sort(by_backward.begin(), by_backward.end(), [&](int a, int b) {
    return profile.candidates[static_cast<size_t>(a)].backward_segment <
           profile.candidates[static_cast<size_t>(b)].backward_segment;
  });
  std::vector<int> look_ahead(choice.size(), -1);
  const std::vector<int64_t> loads = segment_bytes(profile, choice, {});
  for (size_t i = 0; i + 1 < by_backward.size(); ++i) {
    const Candidate& lead = profile.candidates[static_cast<size_t>(by_backward[i])];
    const Candidate& back = profile.candidates[static_cast<size_t>(by_backward[i + 1])];
    const int64_t fetched =
        chosen(profile, choice, static_cast<size_t>(by_backward[i + 1])).fetched_bytes;
    if (fetched == 0 || back.backward_segment <= lead.backward_segment) continue;
    const auto from = loads.begin() + lead.backward_segment;
    const auto to = loads.begin() + back.backward_segment;
    // The windows of consecutive pairs don't overlap: each is checked against the plan's loads.
    if (std::any_of(from, to, [&](int64_t held) { return held + fetched > limit; })) continue;
    look_ahead[static_cast<size_t>(by_backward[i])] = by_backward[i + 1];
  }
  if (std::all_of(look_ahead.begin(), look_ahead.end(), [](int c) { return c < 0; })) return plan;
  plan.prediction = simulate_model(profile, choice, look_ahead);
  plan.look_ahead = std::move(look_ahead);
  return plan;
}

}  // namespace plan
}  // namespace ckpt
