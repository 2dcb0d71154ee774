#pragma once

/// \file
/// The planner's model of any network (not only a chain): a training step measured as a timeline
/// of segments, and candidate regions whose storage mode changes that timeline. See
/// docs/memory-model.md, "Any model", for how the numbers are measured and combined.

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace ckpt {
namespace plan {

/// An option of another candidate.
struct OptionRef {
  int candidate = 0;  ///< index in ModelProfile::candidates
  int option = 0;     ///< index in that candidate's options
};

/// How an executor runs a candidate in one of its options, typed, so that no executor reads it
/// back out of the option's name. The solvers and the simulator ignore it.
struct OptionRun {
  /// The storage mode of the region the candidate runs as, a name in the storage-mode table
  /// ("checkpointed", "selective", "offloaded", ...); empty: it runs plainly, keeping everything.
  std::string mode;
  /// The region lets go of the candidate's outputs, and the region of each candidate that takes
  /// them runs it again to give them back (the "recomputed" options; their mode is
  /// "checkpointed"). Default: false
  bool outputs_recomputed = false;
  /// Of such an option: how many candidates whose outputs are recomputed the chain it ends has
  /// (1: itself alone). Default: 0
  int chain_length = 0;
  /// Of such an option ending a chain of one: only the first candidate that takes its outputs
  /// lets go of them and runs it again; later ones (a U-Net decoder taking its encoder's skip)
  /// keep what they take, as from a checkpointed candidate ("recomputed, skips kept"). Of a
  /// longer chain's end: the chain starts with such a candidate ("recomputed, chain of 2, skips
  /// kept"); its own outputs go to every taker. Default: false
  bool skips_kept = false;
  /// Measured in a step where the candidates that take its outputs without saving them run
  /// plainly, so valid only with those kept ("takers kept"). Default: false
  bool takers_kept = false;
  /// The candidates marked inside this one run as regions of the same mode too, in its forward
  /// and in its recompute: its backward holds one part's activations at a time ("parts
  /// checkpointed"). Default: false
  bool parts_checkpointed = false;
  /// Measured in a step where the candidates whose outputs it takes held none of them, so that
  /// its backward let go of them: valid only beside options of theirs that hold none of their
  /// outputs ("checkpointed, producers let go"). Without it, an option counts such inputs as live
  /// through its backward, as a stored producer's graph keeps them. Default: false
  bool producers_let_go = false;

  /// Whether takers after the first keep its outputs: a chain of one with skips kept.
  bool later_takers_keep_outputs() const {
    return outputs_recomputed && skips_kept && chain_length <= 1;
  }

  /// Runs plainly, keeping everything (option 0 of every candidate).
  static OptionRun stored() { return {}; }
  /// A region in the storage mode `mode`.
  static OptionRun in_mode(std::string mode, bool takers_kept = false,
                           bool parts_checkpointed = false);
  /// A checkpointed region that lets go of its outputs, ending a chain of `chain_length`; with
  /// `skips_kept`, only towards the first candidate that takes them.
  static OptionRun recomputed(int chain_length, bool skips_kept = false);
  /// How plans, reports and `PlannedModel::mode_of` name it: "stored", "checkpointed",
  /// "selective, takers kept", "checkpointed, parts checkpointed", "checkpointed, producers
  /// let go", "recomputed", "recomputed, skips kept", "recomputed, chain of 2".
  std::string name() const;
};

/// One way a candidate can store what its backward needs.
struct CandidateOption {
  /// How plans and reports name it: `run.name()` in a measured profile ("stored" for option 0,
  /// "checkpointed", "selective", "offloaded", "recomputed", ...); any label in a profile
  /// written by hand.
  std::string name;
  /// Seconds the candidate's forward and backward take in this mode (a recompute included).
  double time = 0.0;
  /// Bytes of host memory the mode holds from the candidate's forward to its backward.
  int64_t host_bytes = 0;
  /// Bytes the mode adds to the plain step's peak in segment `Candidate::window_begin + i`,
  /// relative to option 0 (negative where it saves). Segments outside the window are unchanged.
  /// Option 0's deltas are all zero (or empty).
  std::vector<int64_t> peak_delta;
  /// Options of other candidates this one cannot be chosen with: a choice that picks this option
  /// and any of these is invalid (the relation is symmetric: listing it on either side is enough).
  std::vector<OptionRef> excludes{};  // {}: no warning where a brace list stops before it
  /// How the executor runs it. Default: plainly (`OptionRun::stored()`)
  OptionRun run{};
  /// Of an option that offloads: the device bytes its data takes once it is back, from the
  /// start of the candidate's backward on (where its deltas count it). A look-ahead
  /// (`ModelPlan::look_ahead`) holds them from an earlier segment. Default: 0
  int64_t fetched_bytes = 0;
};

/// A marked region of the model (`ckpt::candidate`) and its storage options.
struct Candidate {
  /// The name it was marked with.
  std::string name;
  /// The first segment of the timeline that its options' `peak_delta` cover.
  int window_begin = 0;
  /// Option 0 is "stored"; the others are the storage modes it may run in.
  std::vector<CandidateOption> options;
  /// The first segment of its backward (after its outputs' first gradient), where the look-ahead
  /// starts bringing back the data of the offloaded candidate whose backward begins next; -1
  /// where no gradient reaches it, or the profile does not say. Default: -1
  int backward_segment = -1;
};

/// One measured training step: the plain step's peak in each segment of its timeline (a segment
/// ends where a candidate's forward or backward begins or ends), and the candidates.
struct ModelProfile {
  /// The peak of the plain step (every candidate stored) in each segment, in bytes above what
  /// lived before the step.
  std::vector<int64_t> segment_peak_bytes;
  /// One label per segment, for reports ("forward enc1", "backward enc1", "between", ...).
  std::vector<std::string> segment_labels;
  /// Seconds of one plain step (the candidates' stored times included).
  double step_time = 0.0;
  std::vector<Candidate> candidates;

  /// The plain step's peak: the largest of `segment_peak_bytes` (0 without segments).
  int64_t plain_peak_bytes() const;
  /// Throws std::invalid_argument, saying what is wrong, unless: one label per segment; each
  /// candidate has options, option 0 with no nonzero delta, no host bytes and no exclusions,
  /// every window inside the timeline; times finite and not negative; host bytes not negative;
  /// every exclusion names an existing option of another candidate.
  void validate() const;
};

/// What a choice of options (one index per candidate) costs.
struct ModelPrediction {
  /// Seconds of one step: `step_time` plus each chosen option's time less option 0's.
  double time = 0.0;
  /// The largest over segments of the plain peak plus the chosen options' deltas.
  int64_t peak_bytes = 0;
  /// Host memory held at once: the chosen options' host bytes, summed.
  int64_t host_bytes = 0;
  /// The segment where `peak_bytes` is reached (the first such); -1 without segments.
  int peak_segment = -1;
};

/// Predicts a choice's step time, peak and host memory; with `look_ahead` (one entry per
/// candidate, as `ModelPlan::look_ahead`; empty: none), each offloaded option brought back ahead
/// holds its `fetched_bytes` from the backward segment of the candidate that brings it back to its
/// own. Throws std::invalid_argument when the choice has the wrong length, an index out of range,
/// or picks two options that exclude each other (naming the first such pair), or when a
/// look-ahead brings back an option that fetches nothing or from no earlier segment.
ModelPrediction simulate_model(const ModelProfile& profile, const std::vector<int>& choice,
                               const std::vector<int>& look_ahead = {});

/// Options of `solve_model`.
struct ModelSolverOptions {
  /// Host memory the chosen options may hold at once. Default: unlimited
  int64_t host_budget_bytes = std::numeric_limits<int64_t>::max();
  /// Search nodes each branch and bound may visit: the exact search, then (where that one stops
  /// at the limit) the search within `relative_gap`. Beyond them the solver answers the best
  /// choice found (then `ModelPlan::exact` is false). 0: the heuristic alone.
  int64_t max_exact_nodes = 25'000;
  /// How much slower than the fastest choice that fits the answer may be, as a share of the step
  /// time, where the exact search stops at its node limit: the second search cuts every branch
  /// that cannot beat its best by more than this. Default: 1%
  double relative_gap = 0.01;
};

/// A solved choice.
struct ModelPlan {
  /// Whether some choice fits the budgets. When false, `choice` is empty.
  bool feasible = false;
  /// The option of each candidate.
  std::vector<int> choice;
  ModelPrediction prediction;
  /// Whether the choice is proven the fastest that fits.
  bool exact = false;
  /// Proven: the choice's step time is at most (1 + gap) times the fastest that fits. 0 where
  /// exact; infinity where no search bounded it (`max_exact_nodes` 0, or nothing fits).
  double gap = std::numeric_limits<double>::infinity();
  /// Per candidate: the candidate whose offloaded data comes back when this one's backward
  /// begins, so that its copies run beside this backward; -1: none. Empty: no look-ahead.
  /// `add_look_ahead` fills it, and `prediction` counts it.
  std::vector<int> look_ahead{};
};

/// The fastest valid choice (no two options that exclude each other) whose predicted peak is at
/// most `budget_bytes` and whose host memory is within `options.host_budget_bytes` (ties: the
/// smaller peak). Exact by branch and bound where the search stays within
/// `options.max_exact_nodes`; otherwise within `options.relative_gap` of it where a second search
/// proves that (`ModelPlan::gap` says what was proven), else the best choice found.
ModelPlan solve_model(const ModelProfile& profile, int64_t budget_bytes,
                      const ModelSolverOptions& options = {});

/// Every valid choice tried, for tests (the oracle). Throws std::invalid_argument beyond 2^20
/// choices.
ModelPlan solve_model_brute_force(const ModelProfile& profile, int64_t budget_bytes,
                                  int64_t host_budget_bytes = std::numeric_limits<int64_t>::max());

/// `plan` with a look-ahead for each offloaded option whose data can come back from the start of
/// the backward that begins last before its own, where holding it from there keeps every
/// segment within `budget_bytes` (or the plan's peak, if higher); the prediction counts them
/// (its time does not: the copies it hides were charged). A look-ahead needs no host memory.
ModelPlan add_look_ahead(const ModelProfile& profile, ModelPlan plan, int64_t budget_bytes);

/// The smallest predicted peak of any valid choice within the host budget: the smallest feasible
/// budget.
int64_t min_model_budget(const ModelProfile& profile, const ModelSolverOptions& options = {});

}  // namespace plan
}  // namespace ckpt
