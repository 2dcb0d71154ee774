#pragma once

// The options of each candidate of the any-model profiler: the steps that measure a storage mode
// (`measure_mode`) and chains of recomputed outputs (`run_trials`), and the profile built from
// them, with the options valid only beside others and the pairs that exclude each other.

#include <ckpt/plan/model.h>

#include "autograd/rng_state.h"
#include "measure/step_matching.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace ckpt {
namespace model_profiling {

// One step of a storage mode, and the candidates it ran in the mode.
struct ModeRun {
  std::string name;
  bool recomputes;  // a region that runs its forward again in the backward (not offloading)
  std::shared_ptr<StepRecord> step;
  Matching matching;             // where each plain event is in `step`
  std::vector<bool> measured{};  // the candidates the step ran in the mode (empty: all)
  bool parts = false;            // the markers inside them ran in the mode too

  plan::OptionRun option(bool takers_kept = false) const {
    return plan::OptionRun::in_mode(name, takers_kept, parts);
  }
};

// Whether two steps reached the same candidates (by name) in the same order.
bool same_candidates(const StepRecord& a, const StepRecord& b);

// The candidates of two steps with the same names took tensors of the same shapes: a step
// function that reads its next batch itself gives each profiling step another.
void check_same_inputs(const StepRecord& plain, const StepRecord& other, const std::string& mode);

// A step of a "recomputed" trial: each candidate's depth in a chain there (0: none), and the
// producers it dropped outputs of, with their depths.
struct TrialRun {
  std::shared_ptr<StepRecord> step;
  Matching matching;         // where each plain event is in `step`
  int length = 1;            // of the chains it measured
  bool keeps_skips = false;  // its chains' starts were recomputed for their first taker only
  std::vector<int> depth;
  std::vector<std::map<int, int>> producers;
};

// A "<mode>, producers let go" option (`OptionRun::producers_let_go`): its backward let go of
// outputs of `producers` that the plain step held past it, so it is valid only beside options
// of theirs that hold none of their outputs.
struct ProducersLetGoOption {
  int candidate = 0;
  int option = 0;
  std::set<int> producers;
};

// Each "producers let go" option excludes every option of its producers that holds its outputs
// until its own backward (`lets_go_towards`; `first_takers`, by candidate).
void exclude_producers_that_hold(plan::ModelProfile& profile,
                                 const std::vector<ProducersLetGoOption>& added,
                                 const std::vector<std::vector<bool>>& lets_go,
                                 const std::vector<int>& first_takers);

// Runs a trial's steps (each with every candidate checkpointed) until every candidate ended a
// chain in one, or a step ends none.
void run_trials(const StepSetup& setup, const StepRecord& plain, const CheckpointOptions& region,
                const detail::RngStash& rng, RecomputeTrial& trial, std::vector<TrialRun>& runs);

// Who takes each candidate's recomputable outputs in the trials (`RecomputeTrial::takers`), as
// `PlannedModel` finds them: the first (the lowest index: candidates are numbered in forward
// order; -1: none) and whether later ones take some too (then "recomputed, skips kept" differs
// from "recomputed").
struct Takers {
  std::vector<int> first;
  std::vector<bool> later;

  explicit Takers(const std::vector<std::set<int>>& takers) {
    for (const auto& of_one : takers) {
      first.push_back(of_one.empty() ? -1 : *of_one.begin());
      later.push_back(of_one.size() > 1);
    }
  }
  // Whether candidate `c`, in `run`'s step, kept its later takers' outputs (at depth 1) or ends a
  // chain whose start did: its options from such a step differ from the other trial's.
  bool keeps_skips(const TrialRun& run, int c) const {
    if (!run.keeps_skips || run.depth[c] == 0) return false;
    if (run.depth[c] == 1) return later[c];
    const auto& producers = run.producers[c];
    return std::any_of(producers.begin(), producers.end(),
                       [&](const auto& p) { return keeps_skips(run, p.first); });
  }
};

// Adds the "recomputed" options to each candidate that a trial step ended a chain with, whose
// outputs some region took and let go of, and whose chain's producers offer theirs (from trials
// whose chains start keeping skips, only where a start has later takers). Then excludes the pairs
// of producer and taker options that were not measured together.
void add_recomputed_options(plan::ModelProfile& profile, const StepRecord& plain,
                            const ModeRun& checkpointed, const std::vector<TrialRun>& runs,
                            const std::vector<std::set<int>>& consumers, const Takers& takers);

// The takers of each candidate's outputs that run plainly without saving one of them (a
// decoder's concatenation of a skip), as the step that noted what each forward saves found them.
std::vector<std::set<int>> unsaving_takers(const StepRecord& found);

// The candidates a "takers kept" step runs plainly: every such taker.
std::vector<bool> kept_takers(const std::vector<std::set<int>>& takers);

// A "<mode>, takers kept" option: candidate c in the mode, measured in a step in which the takers
// that don't save its outputs ran plainly (they hold them no longer than the model does, where
// every other mode holds them until its backward). Valid only with those takers kept
// (`exclude_all_but_kept`); its time is the mode's.
struct KeptTakersOption {
  int candidate = 0;
  int option = 0;
};

std::vector<KeptTakersOption> add_kept_takers_options(plan::ModelProfile& profile,
                                                      const StepRecord& plain,
                                                      const std::vector<ModeRun>& steps,
                                                      const std::vector<std::set<int>>& takers);

// Each "takers kept" option excludes every option but "stored" of the takers it was measured with.
void exclude_all_but_kept(plan::ModelProfile& profile, const std::vector<KeptTakersOption>& added,
                          const std::vector<std::set<int>>& takers);

// The candidates each step of a mode runs in it: all in one step, except offloading. An offloaded
// taker moves the outputs it saves to the host, so that the device lets go of them at its forward's
// end; measured beside it, its producer's option would count that as its own outputs let go
// sooner, and a plan that offloads the producer alone would peak above its prediction (by the
// output, on every plan of the bench transformer that offloaded a half). So no step offloads a
// candidate beside one it passes a tensor to or takes one from. Under a host budget a step also
// offloads only as many as the budget holds (each counted at what its plain forward leaves live,
// which is more than it offloads: its outputs stay), and none that alone would not fit (issue 45,
// item 16: profiling held 1.6 MB under a 1 MiB host budget).
std::vector<std::vector<bool>> measured_together(const StepRecord& plain, bool offloads,
                                                 int64_t host_budget);

// Measures `run`'s mode (`region`) on the candidates `run.measured` marks, the others kept, into
// `modes`; and where some candidates are takers to keep (`kept`), once more beside them kept, into
// `with_kept_takers`.
void measure_mode(const StepSetup& setup, const StepRecord& plain, const detail::RngStash& rng,
                  const CheckpointOptions& region, const std::vector<bool>& kept, ModeRun run,
                  std::vector<ModeRun>& modes, std::vector<ModeRun>& with_kept_takers);

// The profile of the plain step (its segments, cut where `cuts` says) and the candidates' options
// measured in `modes`; `producers_let_go` and `lets_go` (by candidate, by option) get what the
// exclusions between them need.
MeasuredModel measured_model(const StepRecord& plain, const std::vector<ModeRun>& modes,
                             const SplitSegments& cuts, c10::Device device,
                             std::vector<ProducersLetGoOption>& producers_let_go,
                             std::vector<std::vector<bool>>& lets_go);

}  // namespace model_profiling
}  // namespace ckpt
