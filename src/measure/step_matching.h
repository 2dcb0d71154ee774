#pragma once

// How a measured step of the any-model profiler lines up with the plain step (`Matching`), and
// what it measured of one candidate there: its costs (`CandidateCosts`) and its bytes over the
// plain step in each segment of its window (`peak_deltas`).

#include "measure/model_step.h"

#include <cstdint>
#include <map>
#include <set>
#include <unordered_set>
#include <utility>
#include <vector>

namespace ckpt {
namespace model_profiling {

// Where a candidate's forward and backward begin and end among a step's events: its backward
// begins with the first gradient of its outputs and ends with the last of its inputs' (at the
// step's end where no input needs one); `backward_begin` is -1 where no output got a gradient.
struct Span {
  int forward_begin = -1, forward_end = -1, backward_begin = -1, backward_end = -1;
};

Span span_of(const StepRecord& step, int candidate);

// What one step measured of one candidate, relative to the live bytes where each part began.
struct CandidateCosts {
  int64_t forward_peak = 0;   // the forward's peak above the bytes live at its start
  int64_t forward_kept = 0;   // the bytes its forward left live
  int64_t backward_peak = 0;  // the backward's peak above the bytes live at its start
  // The inputs (`watched` indices) its backward let go of, and that peak had they stayed live.
  std::vector<size_t> released_inputs;
  int64_t backward_peak_inputs_kept = 0;
  int64_t host = 0;    // the most host bytes its forward held at once
  double seconds = 0;  // its forward's and its backward's
  double forward_seconds = 0;
};

CandidateCosts costs_of(const StepRecord& step, const Span& span, int candidate);

// How another step lines up with the plain one: where each plain event is in it (-1: nowhere),
// and by segment of the plain step, whether the storages it frees there and the plain step holds
// went before the segment's peak (where the segment runs the model's own code, the same in both,
// and the other step's rise in it is the plain one's less those bytes).
struct Matching {
  std::vector<int> events;
  std::vector<bool> freed_before_peak;
  std::vector<bool> split;  // by plain segment: cut in two in the profile (`SplitSegments`)
  // By plain segment cut in two: the blocks that the step let go of there before the peak.
  std::map<int, std::unordered_set<const void*>> gone_at_cut;
};

// The profile's index of plain segment k: after each segment cut in two, one more (k's part
// after the cut; the part before it is one less).
int profile_index(const std::vector<bool>& split, int k);

// The profile's index of the first part of plain segment k (the one before the cut, where cut).
int first_part(const std::vector<bool>& split, int k);

// How `other` lines up with the plain step.
Matching matching_events(const StepRecord& plain, const StepRecord& other);

// Segments of the plain step cut in two where a measured step's own code (no candidate's) lets go
// of watched tensors before the segment's peak: a U-Net's forward returning lets go of the skips
// that checkpointed encoder blocks no longer hold, before the output convolution and the loss. One
// number per segment can't tell how much that lowers its peak, which depends on how much goes
// (on the bench U-Net, the first encoder block's skip alone lowers it by the skip, all four skips
// by less than their sum), and counting them as held through the segment overstated plans by up
// to 1 MiB (1.1%). Before the cut, everything counts as held, with the peak of the code up to the
// last such free; after it, those tensors count as gone, with the segment's peak. Where the step
// shows it (the CPU's frees of watched blocks, `StepRecord::frees`).
struct SplitSegments {
  std::vector<bool> split;          // by plain segment
  std::vector<int64_t> before_cut;  // by plain segment: the peak before the cut (above the start)
};

SplitSegments split_segments(const StepRecord& plain,
                             const std::vector<std::pair<const StepRecord*, Matching*>>& steps);

// One candidate in one step: what it recorded and where its parts begin and end.
struct CandidateInStep {
  const CandidateRecord& record;
  Span span;
  CandidateCosts costs;
};

// What the mode holds over the plain step at event `e` of the plain step (`e_in_mode` in the
// mode's step): what its forward kept less (or more), and its storages still held there.
int64_t held_over_plain_at(const CandidateInStep& plain, const CandidateInStep& mode, int e,
                           int e_in_mode);

// The candidates that made the inputs the mode's step let go of inside its backward while the
// plain step held them past it (-1: not a candidate's output). The plain step's holder was the
// saved graph of the candidate that made them, and in the mode's step it ran in the mode too and
// held nothing.
std::set<int> releasing_producers(const CandidateInStep& plain, const CandidateInStep& mode);

// Whether candidate `c`'s outputs that other candidates take went before its backward began in
// `step`: its region's graph held none of them (a checkpointed region saves its inputs only).
bool lets_go_of_outputs(const StepRecord& step, int c);

// Whether the plain step's input `i` of candidate `c` is taken by another candidate too.
bool shared_input(const StepRecord& plain, int c, size_t i);

// A mode's bytes over the plain step, in each segment of the candidate's window (the plain step's
// segments from its forward to the end of its backward): its forward's peak, then what it keeps
// less (or more) plus the inputs it keeps longer, then its backward's peak on top.
std::vector<int64_t> peak_deltas(const CandidateInStep& plain, const CandidateInStep& mode,
                                 const Matching& in_mode, bool producers_let_go = false);

}  // namespace model_profiling
}  // namespace ckpt
