#include "measure/model_options.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <utility>

namespace ckpt {
namespace model_profiling {
namespace {

bool same_shape(const TensorShape& a, const TensorShape& b) {
  return a.sizes == b.sizes && a.dtype == b.dtype && a.device == b.device &&
         a.requires_grad == b.requires_grad;
}

void check_same_candidates(const StepRecord& plain, const StepRecord& other,
                           const std::string& mode) {
  if (same_candidates(plain, other)) {
    check_same_inputs(plain, other, mode);
    return;
  }
  std::ostringstream first, second;
  for (const auto& c : plain.candidates) first << " " << c.profiled.name;
  for (const auto& c : other.candidates) second << " " << c.profiled.name;
  TORCH_CHECK(false,
              "ckpt::PlannedModel: the model reached other candidates in the profiled step with "
              "every candidate ",
              mode, " (", second.str(), " ) than in the plain step (", first.str(),
              " ). Planning needs a forward that reaches the same candidates in every step: move "
              "what changes between steps out of the candidates' order, or plan each variant "
              "with its own PlannedModel.");
}

// An option that runs as `run`, named after it.
plan::CandidateOption option_in(plan::OptionRun run, double seconds, int64_t host_bytes,
                                std::vector<int64_t> peak_delta) {
  plan::CandidateOption option{run.name(), seconds, host_bytes, std::move(peak_delta), {}};
  option.run = std::move(run);
  return option;
}

// An option measured in a mode's step: its host memory, and the bytes its data took coming back.
plan::CandidateOption measured_option(plan::OptionRun run, double seconds,
                                      const CandidateInStep& mode,
                                      std::vector<int64_t> peak_delta) {
  plan::CandidateOption option =
      option_in(std::move(run), seconds, mode.costs.host, std::move(peak_delta));
  option.fetched_bytes = mode.record.fetched_bytes;
  return option;
}

// Whether `options` already has an option with these bytes kept and peaks: a selective policy
// that saves nothing of a candidate is its checkpointed mode again.
bool offered_already(const plan::Candidate& candidate, const plan::CandidateOption& option) {
  for (size_t i = 1; i < candidate.options.size(); ++i) {
    if (candidate.options[i].peak_delta == option.peak_delta &&
        candidate.options[i].host_bytes == option.host_bytes) {
      return true;
    }
  }
  return false;
}

// A mode's time, never below what it must cost: the plain forward and backward, and for a mode
// that recomputes, the forward once more. (One step's times are noisy; a mode timed faster than
// the plain block would be chosen at budgets that need nothing.)
double at_least_plain_time(const CandidateCosts& kept, const CandidateCosts& mode,
                           const ModeRun& run) {
  const double floor = kept.seconds + (run.recomputes ? kept.forward_seconds : 0.0);
  return std::max(mode.seconds, floor);
}

// Candidate `c`'s options measured in the mode steps; `lets_go` gets by option whether its
// outputs went before its backward began where it was measured (`lets_go_of_outputs`).
// Whether a candidate in a mode kept less after its forward than it does plainly, or held host
// memory: a mode's option is offered only then.
bool keeps_less(const CandidateCosts& kept, const CandidateCosts& mode) {
  return mode.forward_kept < kept.forward_kept || mode.host != 0;
}

plan::Candidate candidate_of(const StepRecord& plain, int c, const std::vector<ModeRun>& modes,
                             const std::vector<bool>& split,
                             std::vector<ProducersLetGoOption>& producers_let_go,
                             std::vector<bool>& lets_go) {
  const Span span = span_of(plain, c);
  const CandidateInStep kept{plain.candidates[c], span, costs_of(plain, span, c)};
  plan::Candidate candidate;
  candidate.name = plain.candidates[c].profiled.name;
  candidate.window_begin = profile_index(split, span.forward_end);
  if (span.backward_begin >= 0)
    candidate.backward_segment = first_part(split, span.backward_begin + 1);
  candidate.options.push_back(option_in(plan::OptionRun::stored(), kept.costs.seconds, 0, {}));
  lets_go.push_back(lets_go_of_outputs(plain, c));
  if (span.backward_begin < 0) return candidate;  // no gradient reaches it: nothing to save
  for (const ModeRun& run : modes) {
    if (!run.measured.empty() && !run.measured[c]) continue;
    const Span mode_span = span_of(*run.step, c);
    if (mode_span.backward_begin < 0) continue;
    const CandidateInStep mode{run.step->candidates[c], mode_span,
                               costs_of(*run.step, mode_span, c)};
    if (!keeps_less(kept.costs, mode.costs)) continue;
    const double seconds = at_least_plain_time(kept.costs, mode.costs, run);
    plan::CandidateOption option =
        measured_option(run.option(), seconds, mode, peak_deltas(kept, mode, run.matching));
    const bool lets_go_here = lets_go_of_outputs(*run.step, c);
    if (!offered_already(candidate, option)) {
      candidate.options.push_back(std::move(option));
      lets_go.push_back(lets_go_here);
    }
    // As measured, valid beside producers that hold none of what it let go of, where nothing
    // else takes it (whose options would have to be told apart too).
    const std::set<int> producers = releasing_producers(kept, mode);
    const auto& released = mode.costs.released_inputs;
    if (producers.empty() || producers.count(-1) > 0 ||
        std::any_of(released.begin(), released.end(),
                    [&](size_t i) { return shared_input(plain, c, i); })) {
      continue;
    }
    plan::OptionRun beside = run.option();
    beside.producers_let_go = true;
    candidate.options.push_back(
        measured_option(beside, seconds, mode, peak_deltas(kept, mode, run.matching, true)));
    lets_go.push_back(lets_go_here);
    producers_let_go.push_back({c, static_cast<int>(candidate.options.size()) - 1, producers});
  }
  return candidate;
}

// Whether `run` is the plain "checkpointed" region: no outputs recomputed, nothing kept beside
// it, no parts.
bool plain_checkpointed(const plan::OptionRun& run) {
  return run.mode == kCheckpointedMode && !run.outputs_recomputed && !run.takers_kept &&
         !run.parts_checkpointed && !run.producers_let_go;
}

// Whether option `op` of candidate `p` holds none of its outputs that `taker` takes until its own
// backward: a "recomputed" option lets go of them; one with skips kept, towards a later taker
// than its first, runs as the "checkpointed" region it is (`lets_go`: measured, by option).
bool lets_go_towards(const std::vector<plan::CandidateOption>& options,
                     const std::vector<bool>& lets_go, int op, int taker, int first_taker) {
  const plan::OptionRun& run = options[op].run;
  if (run.outputs_recomputed && (!run.later_takers_keep_outputs() || first_taker == taker))
    return true;
  if (run.outputs_recomputed) {
    const auto checkpointed = std::find_if(options.begin(), options.end(),
                                           [](const auto& o) { return plain_checkpointed(o.run); });
    op = static_cast<int>(checkpointed - options.begin());
  }
  return static_cast<size_t>(op) < lets_go.size() && lets_go[op];
}

// Seconds that running candidate `c` again costs in `trial`: its forward, and that of each
// producer it dropped outputs of (which runs again to give them, and so on up the chain).
double chain_seconds(const ModeRun& checkpointed, const TrialRun& trial, int c) {
  double seconds = costs_of(*checkpointed.step, span_of(*checkpointed.step, c), c).forward_seconds;
  for (const auto& [p, depth] : trial.producers[c])
    seconds += chain_seconds(checkpointed, trial, p);
  return seconds;
}

// The bytes of the inputs candidate c dropped (outputs of `producers`, recomputed) that the trial
// step freed by the end of c's forward and the plain step still held there. Their producers'
// options count them as let go (an output freed sooner), so c's plateau must not count them again
// (it would where c's argument was a temporary, which the region's drop frees inside c's forward).
int64_t dropped_in_forward(const CandidateRecord& plain, const CandidateRecord& trial,
                           const Span& plain_span, const Span& trial_span,
                           const std::map<int, int>& producers) {
  int64_t bytes = 0;
  for (size_t i = 0; i < plain.watched.size() && i < trial.watched.size(); ++i) {
    const WatchedStorage& a = plain.watched[i];
    const WatchedStorage& b = trial.watched[i];
    if (a.output || b.producer < 0 || producers.count(b.producer) == 0) continue;
    const bool freed = b.freed_at >= 0 && b.freed_at <= trial_span.forward_end;
    const bool held = a.freed_at < 0 || a.freed_at > plain_span.forward_end;
    if (freed && held) bytes += a.bytes;
  }
  return bytes;
}

// Candidate `c`'s "recomputed" option, from the trial step that ended a chain with it: its own
// costs as there (its outputs freed where the model let go of them), and on the takers' backward
// what it holds where that backward begins plus what running it again costs them there (their
// backward's peak over the checkpointed step's: where a taker ran several candidates again at
// once, each is charged with all of it, which only overstates) and its chain's forwards once per
// taker. Where `c` dropped its producers' outputs, its own backward ran them again: their options
// count that (`c` is their taker), so its backward's peak and time are the checkpointed step's.
plan::CandidateOption recomputed_option(const StepRecord& plain, const ModeRun& checkpointed,
                                        const TrialRun& trial, int c, const std::set<int>& takers,
                                        const plan::OptionRun& how) {
  const Span span = span_of(plain, c);
  const CandidateInStep kept{plain.candidates[c], span, costs_of(plain, span, c)};
  const Span trial_span = span_of(*trial.step, c);
  CandidateInStep mode{trial.step->candidates[c], trial_span, costs_of(*trial.step, trial_span, c)};
  const CandidateCosts own = costs_of(*checkpointed.step, span_of(*checkpointed.step, c), c);
  if (!trial.producers[c].empty()) {
    mode.costs.backward_peak = own.backward_peak;
    mode.costs.released_inputs = own.released_inputs;
    mode.costs.backward_peak_inputs_kept = own.backward_peak_inputs_kept;
    mode.costs.seconds = own.seconds;
    mode.costs.forward_kept +=
        dropped_in_forward(plain.candidates[c], mode.record, span, trial_span, trial.producers[c]);
  }
  std::vector<int64_t> deltas = peak_deltas(kept, mode, trial.matching);
  double seconds = std::max(mode.costs.seconds, kept.costs.seconds + kept.costs.forward_seconds);
  for (int t : takers) {
    const Span taker = span_of(plain, t);
    if (taker.backward_begin < 0) continue;  // no backward: nothing runs it again
    const Span trial_taker = span_of(*trial.step, t);
    const int64_t rerun =
        costs_of(*trial.step, trial_taker, t).backward_peak -
        costs_of(*checkpointed.step, span_of(*checkpointed.step, t), t).backward_peak;
    // In the taker's backward: what c holds where it begins (read at that event in both steps,
    // not by segment), and the taker's peak above that raised by running c again.
    const int64_t at_taker =
        held_over_plain_at(kept, mode, taker.backward_begin, trial_taker.backward_begin);
    for (int k = taker.backward_begin + 1; k <= taker.backward_end; ++k) {
      const int j = profile_index(trial.matching.split, k) -
                    profile_index(trial.matching.split, span.forward_end);
      if (j >= 0 && j < static_cast<int>(deltas.size()))
        deltas[j] = at_taker + std::max<int64_t>(rerun, 0);
    }
    seconds += chain_seconds(checkpointed, trial, c);
  }
  return option_in(how, seconds, 0, std::move(deltas));
}

// A "recomputed" option offered: its chain's depth (0: not such an option), whether it keeps
// skips (`Takers::keeps_skips`), and each producer it dropped outputs of in its trial step, with
// that producer's depth and whether it kept skips there.
struct ChainOption {
  int depth = 0;
  bool keeps_skips = false;
  std::map<int, std::pair<int, bool>> producers{};
};

// Whether producer option `p` lets go of its outputs towards `taker`: a chain's start that keeps
// skips only towards its first taker.
bool drops_towards(const ChainOption& p, int producer, int taker, const Takers& takers) {
  return p.depth > 0 && (p.depth > 1 || !p.keeps_skips || takers.first[producer] == taker);
}

// Whether producer option `p` and taker option `t` (of candidate `taker`, which takes p's
// outputs) may be chosen together: the taker as it was measured (a chain end measured with this
// producer at this depth and so recomputed, a chain start with none dropped), and a producer
// whose outputs the taker drops only with a taker that runs "checkpointed" or is measured so.
bool compatible(const ChainOption& p, const ChainOption& t, const plan::OptionRun& taker_run,
                int producer, int taker, const Takers& takers) {
  const int depth = drops_towards(p, producer, taker, takers) ? p.depth : 0;
  if (t.depth > 0) {
    const auto found = t.producers.find(producer);
    if (found == t.producers.end()) return depth == 0;
    return std::pair(depth, p.keeps_skips) == found->second;
  }
  // "Producers let go" is measured with producers that hold none of their outputs: a recomputed
  // one qualifies.
  plan::OptionRun as_measured = taker_run;
  as_measured.producers_let_go = false;
  return depth == 0 || plain_checkpointed(as_measured);
}

bool lower_somewhere(const std::vector<int64_t>& deltas, const std::vector<int64_t>& than) {
  for (size_t i = 0; i < deltas.size() && i < than.size(); ++i) {
    if (deltas[i] < than[i]) return true;
  }
  return false;
}

std::string segment_label(const StepRecord& step, const Event& end) {
  const std::string name = end.candidate >= 0 ? step.candidates[end.candidate].profiled.name : "";
  switch (end.kind) {
    case EventKind::ForwardBegin:
      return "before the forward of " + name;
    case EventKind::ForwardEnd:
      return "forward of " + name;
    case EventKind::BackwardBegin:
      return "before the backward of " + name;
    case EventKind::BackwardEnd:
      return "backward of " + name;
    case EventKind::StepEnd:
      return "end of the backward";
  }
  return "";
}

// The candidates that pass a tensor between them (one took an output of the other).
std::vector<std::set<int>> neighbours(const StepRecord& plain) {
  std::vector<std::set<int>> near(plain.candidates.size());
  for (size_t t = 0; t < plain.candidates.size(); ++t) {
    for (const WatchedStorage& w : plain.candidates[t].watched) {
      if (w.output || w.producer < 0) continue;
      near[t].insert(w.producer);
      near[static_cast<size_t>(w.producer)].insert(static_cast<int>(t));
    }
  }
  return near;
}

// Whether some candidate the mode's step ran in the mode kept less after its forward than the
// plain step's, or held host memory: where none did (a selective policy that keeps every
// convolution's output, in a convolutional network), the step offers no option.
bool keeps_less_anywhere(const StepRecord& plain, const ModeRun& run) {
  for (int c = 0; c < static_cast<int>(plain.candidates.size()); ++c) {
    if (!run.measured.empty() && !run.measured[c]) continue;
    const Span kept_span = span_of(plain, c), mode_span = span_of(*run.step, c);
    if (kept_span.backward_begin < 0 || mode_span.backward_begin < 0) continue;
    if (keeps_less(costs_of(plain, kept_span, c), costs_of(*run.step, mode_span, c))) return true;
  }
  return false;
}

}  // namespace

bool same_candidates(const StepRecord& a, const StepRecord& b) {
  return std::equal(
      a.candidates.begin(), a.candidates.end(), b.candidates.begin(), b.candidates.end(),
      [](const auto& x, const auto& y) { return x.profiled.name == y.profiled.name; });
}

void check_same_inputs(const StepRecord& plain, const StepRecord& other, const std::string& mode) {
  for (size_t c = 0; c < plain.candidates.size(); ++c) {
    const ProfiledCandidate& expected = plain.candidates[c].profiled;
    const ProfiledCandidate& got = other.candidates[c].profiled;
    const TensorShape none{{}, c10::ScalarType::Undefined};  // an input one step lacks
    for (size_t i = 0; i < std::max(expected.inputs.size(), got.inputs.size()); ++i) {
      const TensorShape& a = i < expected.inputs.size() ? expected.inputs[i] : none;
      const TensorShape& b = i < got.inputs.size() ? got.inputs[i] : none;
      TORCH_CHECK(same_shape(a, b), "ckpt::PlannedModel: input ", i, " of candidate \"",
                  expected.name, "\" is ", b.to_string(),
                  " in the profiled step with every candidate ", mode,
                  " where the plain step gave it ", a.to_string(),
                  ". Profiling runs the step function several times and measures one step: the "
                  "same inputs each call. Read the batch before the function, and let it use that "
                  "batch (run([&] { return loss_of(model->forward(batch)); })).");
    }
  }
}

void exclude_producers_that_hold(plan::ModelProfile& profile,
                                 const std::vector<ProducersLetGoOption>& added,
                                 const std::vector<std::vector<bool>>& lets_go,
                                 const std::vector<int>& first_takers) {
  for (const auto& [c, o, producers] : added) {
    auto& excludes = profile.candidates[c].options[o].excludes;
    for (int p : producers) {
      const auto& options = profile.candidates[p].options;
      for (int op = 0; op < static_cast<int>(options.size()); ++op) {
        if (!lets_go_towards(options, lets_go[p], op, c, first_takers[p]))
          excludes.push_back({p, op});
      }
    }
  }
}

void run_trials(const StepSetup& setup, const StepRecord& plain, const CheckpointOptions& region,
                const detail::RngStash& rng, RecomputeTrial& trial, std::vector<TrialRun>& runs) {
  // At most L + 1 steps, or four, per length (docs/memory-model.md says how far they reach).
  const int steps = std::max(trial.length + 1, 4);
  for (int s = 0; s < steps; ++s) {
    if (s > 0 && !trial.ends_a_chain_next()) break;
    trial.start_step();
    rng.restore();
    auto step = record_step(setup, {region, {}, &trial});
    check_same_candidates(plain, *step, plan::OptionRun::recomputed(1).name());
    if (std::find(trial.depth.begin(), trial.depth.end(), trial.length) == trial.depth.end()) break;
    Matching matching = matching_events(plain, *step);
    runs.push_back({std::move(step), std::move(matching), trial.length, trial.keeps_skips,
                    trial.depth, trial.producers});
    if (std::find(trial.measured.begin(), trial.measured.end(), false) == trial.measured.end())
      break;
  }
}

void add_recomputed_options(plan::ModelProfile& profile, const StepRecord& plain,
                            const ModeRun& checkpointed, const std::vector<TrialRun>& runs,
                            const std::vector<std::set<int>>& consumers, const Takers& takers) {
  std::vector<std::map<int, ChainOption>> chains(profile.candidates.size());  // by option
  std::map<std::tuple<int, int, bool>, int> option_at;  // (candidate, depth, keeps skips)
  for (const TrialRun& run : runs) {
    for (int c = 0; c < static_cast<int>(run.depth.size()); ++c) {
      const bool keeps_skips = takers.keeps_skips(run, c);
      if (run.depth[c] != run.length || consumers[c].empty() || run.keeps_skips != keeps_skips ||
          option_at.count({c, run.length, keeps_skips}))
        continue;
      if (span_of(plain, c).backward_begin < 0) continue;  // no gradient
      ChainOption chain{run.length, keeps_skips};
      for (const auto& [producer, depth] : run.producers[c])
        chain.producers[producer] = {depth, takers.keeps_skips(run, producer)};
      const bool chained =
          std::all_of(chain.producers.begin(), chain.producers.end(), [&](const auto& p) {
            return option_at.count({p.first, p.second.first, p.second.second}) > 0;
          });
      if (!chained) continue;
      const plan::OptionRun how = plan::OptionRun::recomputed(run.length, keeps_skips);
      const std::set<int> rerun_by =
          how.later_takers_keep_outputs() ? std::set<int>{takers.first[c]} : consumers[c];
      plan::CandidateOption option = recomputed_option(plain, checkpointed, run, c, rerun_by, how);
      if (std::none_of(option.peak_delta.begin(), option.peak_delta.end(),
                       [](int64_t d) { return d < 0; })) {
        continue;
      }
      auto& options = profile.candidates[c].options;
      options.push_back(std::move(option));
      const int o = static_cast<int>(options.size()) - 1;
      option_at[{c, run.length, keeps_skips}] = o;
      chains[c][o] = std::move(chain);
    }
  }
  const auto chain_of = [&](int c, int o) {
    const auto found = chains[c].find(o);
    return found == chains[c].end() ? ChainOption() : found->second;
  };
  for (int p = 0; p < static_cast<int>(profile.candidates.size()); ++p) {
    if (chains[p].empty()) continue;  // no recomputed outputs: every taker's option fits
    auto& producer = profile.candidates[p].options;
    for (int t : consumers[p]) {
      auto& taker = profile.candidates[t].options;
      for (int op = 0; op < static_cast<int>(producer.size()); ++op) {
        for (int ot = 0; ot < static_cast<int>(taker.size()); ++ot) {
          if (compatible(chain_of(p, op), chain_of(t, ot), taker[ot].run, p, t, takers)) continue;
          // Option 0 excludes nothing (storing everything stays valid): the other side lists it.
          if (op != 0)
            producer[op].excludes.push_back({t, ot});
          else
            taker[ot].excludes.push_back({p, op});
        }
      }
    }
  }
}

std::vector<std::set<int>> unsaving_takers(const StepRecord& found) {
  std::vector<std::set<int>> takers(found.candidates.size());
  for (size_t t = 0; t < found.candidates.size(); ++t) {
    for (const auto& w : found.candidates[t].watched) {
      if (!w.output && w.producer >= 0 && !w.saved) takers[w.producer].insert(static_cast<int>(t));
    }
  }
  return takers;
}

std::vector<bool> kept_takers(const std::vector<std::set<int>>& takers) {
  std::vector<bool> kept(takers.size(), false);
  for (const auto& of_one : takers) {
    for (int t : of_one) kept[t] = true;
  }
  return kept;
}

std::vector<KeptTakersOption> add_kept_takers_options(plan::ModelProfile& profile,
                                                      const StepRecord& plain,
                                                      const std::vector<ModeRun>& steps,
                                                      const std::vector<std::set<int>>& takers) {
  const std::vector<bool> kept = kept_takers(takers);
  std::vector<KeptTakersOption> added;
  for (int c = 0; c < static_cast<int>(takers.size()); ++c) {
    const Span span = span_of(plain, c);
    if (takers[c].empty() || kept[c] || span.backward_begin < 0) continue;
    const CandidateInStep stored{plain.candidates[c], span, costs_of(plain, span, c)};
    plan::Candidate& candidate = profile.candidates[c];
    for (const ModeRun& run : steps) {
      if (!run.measured.empty() && !run.measured[c]) continue;
      const auto same_mode =
          std::find_if(candidate.options.begin(), candidate.options.end(),
                       [&](const auto& o) { return o.name == run.option().name(); });
      const Span mode_span = span_of(*run.step, c);
      if (same_mode == candidate.options.end() || mode_span.backward_begin < 0) continue;
      const CandidateInStep mode{run.step->candidates[c], mode_span,
                                 costs_of(*run.step, mode_span, c)};
      plan::CandidateOption option =
          measured_option(run.option(/*takers_kept=*/true), same_mode->time, mode,
                          peak_deltas(stored, mode, run.matching));
      if (!lower_somewhere(option.peak_delta, same_mode->peak_delta) ||
          offered_already(candidate, option)) {
        continue;
      }
      candidate.options.push_back(std::move(option));
      added.push_back({c, static_cast<int>(candidate.options.size()) - 1});
    }
  }
  return added;
}

void exclude_all_but_kept(plan::ModelProfile& profile, const std::vector<KeptTakersOption>& added,
                          const std::vector<std::set<int>>& takers) {
  for (const auto& [c, o] : added) {
    auto& excludes = profile.candidates[c].options[o].excludes;
    for (int t : takers[c]) {
      for (int ot = 1; ot < static_cast<int>(profile.candidates[t].options.size()); ++ot)
        excludes.push_back({t, ot});
    }
  }
}

std::vector<std::vector<bool>> measured_together(const StepRecord& plain, bool offloads,
                                                 int64_t host_budget) {
  const size_t count = plain.candidates.size();
  if (!offloads) return {std::vector<bool>(count, true)};
  const std::vector<std::set<int>> near = neighbours(plain);
  std::vector<std::vector<bool>> groups;
  std::vector<int64_t> held;  // per group
  for (size_t c = 0; c < count; ++c) {
    const int index = static_cast<int>(c);
    int64_t bytes = costs_of(plain, span_of(plain, index), index).forward_kept;
    for (const WatchedStorage& w : plain.candidates[c].watched) {
      if (w.output) bytes -= w.bytes;  // stays on the device
    }
    bytes = std::max<int64_t>(0, bytes);
    if (bytes > host_budget) continue;
    size_t g = 0;
    const auto fits = [&](size_t group) {
      if (held[group] > host_budget - bytes) return false;
      return std::none_of(near[c].begin(), near[c].end(),
                          [&](int other) { return groups[group][static_cast<size_t>(other)]; });
    };
    while (g < groups.size() && !fits(g)) ++g;
    if (g == groups.size()) {
      groups.emplace_back(count, false);
      held.push_back(0);
    }
    groups[g][c] = true;
    held[g] += bytes;
  }
  return groups;
}

void measure_mode(const StepSetup& setup, const StepRecord& plain, const detail::RngStash& rng,
                  const CheckpointOptions& region, const std::vector<bool>& kept, ModeRun run,
                  std::vector<ModeRun>& modes, std::vector<ModeRun>& with_kept_takers) {
  std::vector<bool> others(run.measured.size());
  std::transform(run.measured.begin(), run.measured.end(), others.begin(), std::logical_not<>());
  const std::optional<CheckpointOptions> parts =
      run.parts ? std::optional<CheckpointOptions>(region) : std::nullopt;
  const uint64_t learned = detail::learning_moment();
  rng.restore();
  run.step = record_step(setup, {region, others, nullptr, false, parts});
  if (detail::learning_moment() != learned) {
    // A region learned how to run at its call site (a part that writes into its argument kept
    // its activations this once): measured again, as it runs from now on.
    rng.restore();
    run.step = record_step(setup, {region, others, nullptr, false, parts});
  }
  check_same_candidates(plain, *run.step, run.option().name());
  run.matching = matching_events(plain, *run.step);
  modes.push_back(run);
  if (std::find(kept.begin(), kept.end(), true) == kept.end()) return;
  if (!keeps_less_anywhere(plain, run)) return;  // nor would it with takers kept
  for (size_t c = 0; c < others.size(); ++c) others[c] = others[c] || kept[c];
  rng.restore();
  run.step = record_step(setup, {region, others, nullptr, false, parts});
  check_same_candidates(plain, *run.step, run.option(/*takers_kept=*/true).name());
  run.matching = matching_events(plain, *run.step);
  with_kept_takers.push_back(std::move(run));
}

MeasuredModel measured_model(const StepRecord& plain, const std::vector<ModeRun>& modes,
                             const SplitSegments& cuts, c10::Device device,
                             std::vector<ProducersLetGoOption>& producers_let_go,
                             std::vector<std::vector<bool>>& lets_go) {
  MeasuredModel measured;
  measured.device = device;
  plan::ModelProfile& profile = measured.profile;
  for (size_t k = 0; k < plain.events.size(); ++k) {
    const Event& e = plain.events[k];
    if (cuts.split[k]) {
      profile.segment_peak_bytes.push_back(cuts.before_cut[k]);
      profile.segment_labels.push_back(segment_label(plain, e) + ", until tensors are let go");
    }
    profile.segment_peak_bytes.push_back(e.peak - plain.start_bytes);
    profile.segment_labels.push_back(segment_label(plain, e));
  }
  profile.step_time =
      std::chrono::duration<double>(plain.events.back().time - plain.start_time).count();
  for (int c = 0; c < static_cast<int>(plain.candidates.size()); ++c) {
    lets_go.emplace_back();
    profile.candidates.push_back(
        candidate_of(plain, c, modes, cuts.split, producers_let_go, lets_go.back()));
    measured.candidates.push_back(plain.candidates[c].profiled);
  }
  return measured;
}

}  // namespace model_profiling
}  // namespace ckpt
