#include "measure/step_matching.h"

#include <algorithm>
#include <chrono>
#include <map>

namespace ckpt {
namespace model_profiling {
namespace {

double seconds_between(const Event& from, const Event& to) {
  return std::chrono::duration<double>(to.time - from.time).count();
}

// The inputs of `candidate` that `step` let go of in segments (from, to] of its backward, and its
// backward's peak there had they stayed live: each segment split where the watched blocks went
// (where the step noted it), each released input counted from its free on. Where the step can't
// tell when an input went, it counts as live through the whole backward, which only overstates.
void keep_released_inputs(const StepRecord& step, int candidate, int from, int to,
                          CandidateCosts& costs) {
  const auto& watched = step.candidates[candidate].watched;
  std::map<const void*, int64_t> released;
  for (size_t i = 0; i < watched.size(); ++i) {
    const WatchedStorage& w = watched[i];
    if (w.output || w.freed_at <= from || w.freed_at > to) continue;
    costs.released_inputs.push_back(i);
    released[w.data] += w.bytes;
  }
  const auto first = std::find_if(step.frees.begin(), step.frees.end(),
                                  [&](const StepRecord::Free& f) { return f.segment > from; });
  int64_t kept = 0;  // from the start: those whose free the step did not see
  for (const auto& [data, bytes] : released) {
    const bool seen = std::any_of(first, step.frees.end(), [&](const StepRecord::Free& f) {
      return f.data == data && f.segment <= to;
    });
    if (!seen) kept += bytes;
  }
  int64_t peak = 0;
  auto free = first;
  for (int k = from + 1; k <= to; ++k) {
    const int64_t tail = step.events[k].tail_peak;  // `peak` where no free was noted
    for (; free != step.frees.end() && free->segment == k; ++free) {
      peak = std::max(peak, free->peak + kept - step.events[from].live);
      const auto found = released.find(free->data);
      if (found != released.end()) kept += found->second;
    }
    peak = std::max(peak, tail + kept - step.events[from].live);
  }
  costs.backward_peak_inputs_kept = peak;
}

// Where each event of the plain step is in another step: events are the same boundaries of the
// same candidates, told apart by their kind, candidate and how many came before them; -1 where
// the other step has no such event.
std::vector<int> matching_events_of(const StepRecord& plain, const StepRecord& other) {
  using Key = std::tuple<int, int, int>;
  std::map<Key, int> count, where;
  for (int k = 0; k < static_cast<int>(other.events.size()); ++k) {
    const Event& e = other.events[k];
    const Key id{static_cast<int>(e.kind), e.candidate, 0};
    where[{static_cast<int>(e.kind), e.candidate, count[id]++}] = k;
  }
  count.clear();
  std::vector<int> match;
  for (const Event& e : plain.events) {
    const Key id{static_cast<int>(e.kind), e.candidate, 0};
    const auto found = where.find({static_cast<int>(e.kind), e.candidate, count[id]++});
    match.push_back(found == where.end() ? -1 : found->second);
  }
  return match;
}

// Whether segment k of the plain step runs no candidate's forward or backward: the model's own
// code between them, the same in every step.
std::vector<bool> between_candidates(const StepRecord& plain) {
  std::vector<bool> between(plain.events.size(), true);
  for (int c = 0; c < static_cast<int>(plain.candidates.size()); ++c) {
    const Span span = span_of(plain, c);
    for (int k = span.forward_begin + 1; k <= span.forward_end; ++k) between[k] = false;
    if (span.backward_begin < 0) continue;
    for (int k = span.backward_begin + 1; k <= span.backward_end; ++k) between[k] = false;
  }
  return between;
}

// The bytes of the watched storages that `other` frees in its segment `k_other` and the plain
// step holds through its segment k (each storage once: an input another candidate returned is
// that one's output).
int64_t freed_sooner_in(const StepRecord& plain, const StepRecord& other, int k, int k_other) {
  int64_t bytes = 0;
  for (size_t c = 0; c < plain.candidates.size(); ++c) {
    const auto& a = plain.candidates[c].watched;
    const auto& b = other.candidates[c].watched;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
      if (!a[i].output && a[i].producer >= 0) continue;
      if (b[i].freed_at == k_other && (a[i].freed_at < 0 || a[i].freed_at > k)) bytes += a[i].bytes;
    }
  }
  return bytes;
}

// What `other`'s segment j shows of the watched blocks it let go of: those that went before its
// peak (had each stayed, where the rest of the code would have peaked), and how far above the
// bytes live at the segment's start it rose up to the last of them, counting them as held (-1:
// none went before the peak).
struct FreesBeforePeak {
  int64_t rise = -1;
  std::unordered_set<const void*> blocks;
};

FreesBeforePeak frees_before_peak(const StepRecord& other, int j) {
  const auto bytes_of = [&](const void* data) -> int64_t {
    for (const auto& c : other.candidates) {
      for (const WatchedStorage& w : c.watched) {
        if (w.data == data) return w.bytes;
      }
    }
    return 0;
  };
  const int64_t live = other.events[j - 1].live;
  std::vector<const StepRecord::Free*> frees;
  std::vector<int64_t> held_rise;  // by part of the segment between frees, the blocks held
  int64_t freed = 0;
  for (const StepRecord::Free& f : other.frees) {
    if (f.segment != j) continue;
    frees.push_back(&f);
    held_rise.push_back(f.peak + freed - live);
    freed += bytes_of(f.data);
  }
  held_rise.push_back(other.events[j].tail_peak + freed - live);
  // The peak's part: the last of the highest (the frees before it went before the peak).
  size_t peak = 0;
  for (size_t i = 0; i < held_rise.size(); ++i) {
    if (held_rise[i] >= held_rise[peak]) peak = i;
  }
  FreesBeforePeak before;
  for (size_t i = 0; i < peak; ++i) {
    before.blocks.insert(frees[i]->data);
    before.rise = std::max(before.rise, held_rise[i]);
  }
  return before;
}

// What the mode's step holds beyond the plain step of the storages a candidate took or returned:
// inputs kept longer count, outputs let go sooner count against it. An output another candidate
// takes counts too: whatever that candidate's mode, it holds the output at most until its own
// backward ends, as in the mode's step (where it runs in the mode). `held(watched, step)` tells
// whether a storage counts.
template <class Held>
int64_t held_difference(const CandidateRecord& plain, const CandidateRecord& mode, Held held) {
  int64_t bytes = 0;
  for (size_t i = 0; i < plain.watched.size() && i < mode.watched.size(); ++i) {
    const WatchedStorage& a = plain.watched[i];
    const int64_t difference =
        (static_cast<int64_t>(held(mode.watched[i], true)) - held(a, false)) * a.bytes;
    if (!a.output && difference > 0) bytes += difference;
    if (a.output && difference < 0) bytes += difference;
  }
  return bytes;
}

// In segment `k` of the plain step (the mode's step's `in_mode.events[k]`, -1: none): a storage
// counts as held in the segment it is freed in (unless the mode's step shows that what it freed
// there went before the segment's peak), and as gone from the plain step only after it.
enum class SegmentPart { Whole, BeforeCut, AfterCut };

int64_t held_in_segment(const CandidateRecord& plain, const CandidateRecord& mode, int k,
                        const Matching& in_mode, SegmentPart part = SegmentPart::Whole) {
  const int k_in_mode = in_mode.events[k];
  const auto cut = in_mode.gone_at_cut.find(k);
  const auto gone_at_peak = [&](const WatchedStorage& w) {
    switch (part) {
      case SegmentPart::Whole:
        return static_cast<bool>(in_mode.freed_before_peak[k]);
      case SegmentPart::BeforeCut:
        return false;
      case SegmentPart::AfterCut:
        return cut != in_mode.gone_at_cut.end() && cut->second.count(w.data) > 0;
    }
    return false;
  };
  return held_difference(plain, mode, [&](const WatchedStorage& w, bool in_mode_step) {
    if (in_mode_step) {
      return k_in_mode < 0 || w.freed_at < 0 || k_in_mode < w.freed_at ||
             (k_in_mode == w.freed_at && !gone_at_peak(w));
    }
    return w.freed_at < 0 || k < w.freed_at;
  });
}

// At event `e` of the plain step (`e_in_mode` in the mode's step): what is still live there.
int64_t held_at_event(const CandidateRecord& plain, const CandidateRecord& mode, int e,
                      int e_in_mode) {
  return held_difference(plain, mode, [&](const WatchedStorage& w, bool in_mode) {
    const int at = in_mode ? e_in_mode : e;
    return w.freed_at < 0 || w.freed_at > at;
  });
}

// The mode's backward peak above what it held where it began. Beside producers kept, the inputs
// its step let go of inside it (`releasing_producers`) stay: they count as live (on the test
// U-Net, a decoder block checkpointed beside its encoder block stored peaked 128 KiB, the skip,
// above a prediction that left them out). `producers_let_go`: as measured, for the option valid
// only beside producers that hold none of them.
int64_t backward_peak_of(const CandidateInStep& plain, const CandidateInStep& mode,
                         bool producers_let_go) {
  if (producers_let_go || releasing_producers(plain, mode).empty()) return mode.costs.backward_peak;
  return mode.costs.backward_peak_inputs_kept;
}

}  // namespace

Span span_of(const StepRecord& step, int candidate) {
  Span span;
  int last_input_gradient = -1;
  for (int k = 0; k < static_cast<int>(step.events.size()); ++k) {
    const Event& e = step.events[k];
    if (e.candidate != candidate) continue;
    if (e.kind == EventKind::ForwardBegin) span.forward_begin = k;
    if (e.kind == EventKind::ForwardEnd) span.forward_end = k;
    if (e.kind == EventKind::BackwardBegin && span.backward_begin < 0) span.backward_begin = k;
    if (e.kind == EventKind::BackwardEnd) last_input_gradient = k;
  }
  const int step_end = static_cast<int>(step.events.size()) - 1;
  span.backward_end = last_input_gradient >= 0 ? last_input_gradient : step_end;
  if (span.backward_begin >= 0)
    span.backward_end = std::max(span.backward_end, span.backward_begin);
  return span;
}

CandidateCosts costs_of(const StepRecord& step, const Span& span, int candidate) {
  const auto& ev = step.events;
  const Event& fb = ev[span.forward_begin];
  const Event& fe = ev[span.forward_end];
  CandidateCosts costs;
  costs.forward_peak = fe.peak - fb.live;
  costs.forward_kept = fe.live - fb.live;
  // The most its forward held: an offloaded region copies its results too, and lets go of those
  // copies when its forward ends (they stay on the device).
  for (int k = span.forward_begin + 1; k <= span.forward_end; ++k) {
    costs.host = std::max(costs.host, ev[k].host_peak - fb.host);
  }
  costs.forward_seconds = seconds_between(fb, fe);
  costs.seconds = costs.forward_seconds;
  if (span.backward_begin < 0) return costs;
  // Its backward's peak, until its last input's gradient or another candidate's backward begins
  // (the engine may run another branch before it hands over the last input gradient).
  const Event& bb = ev[span.backward_begin];
  int last = span.backward_begin;
  while (last < span.backward_end) {
    ++last;
    costs.backward_peak = std::max(costs.backward_peak, ev[last].peak - bb.live);
    if (ev[last].kind == EventKind::BackwardBegin && ev[last].candidate != candidate) break;
  }
  keep_released_inputs(step, candidate, span.backward_begin, last, costs);
  costs.seconds += seconds_between(bb, ev[span.backward_end]);
  return costs;
}

int profile_index(const std::vector<bool>& split, int k) {
  int index = k;
  for (int i = 0; i <= k && i < static_cast<int>(split.size()); ++i) index += split[i] ? 1 : 0;
  return index;
}

int first_part(const std::vector<bool>& split, int k) {
  const bool cut = k < static_cast<int>(split.size()) && split[k];
  return profile_index(split, k) - (cut ? 1 : 0);
}

Matching matching_events(const StepRecord& plain, const StepRecord& other) {
  Matching matching{matching_events_of(plain, other), {}, {}, {}};
  const std::vector<bool> between = between_candidates(plain);
  matching.freed_before_peak.assign(plain.events.size(), false);
  for (size_t k = 1; k < plain.events.size(); ++k) {
    const int j = matching.events[k];
    if (!between[k] || j < 1 || matching.events[k - 1] != j - 1) continue;
    const int64_t freed = freed_sooner_in(plain, other, static_cast<int>(k), j);
    const int64_t rise = plain.events[k].peak - plain.events[k - 1].live;
    const int64_t other_rise = other.events[j].peak - other.events[j - 1].live;
    matching.freed_before_peak[k] = freed > 0 && other_rise <= rise - freed;
  }
  return matching;
}

SplitSegments split_segments(const StepRecord& plain,
                             const std::vector<std::pair<const StepRecord*, Matching*>>& steps) {
  const size_t count = plain.events.size();
  SplitSegments cuts{std::vector<bool>(count, false), std::vector<int64_t>(count, -1)};
  const std::vector<bool> between = between_candidates(plain);
  for (size_t k = 1; k < count; ++k) {
    if (!between[k]) continue;
    int64_t before = -1;
    for (const auto& [other, matching] : steps) {
      const int j = matching->events[k];
      if (j < 1 || matching->events[k - 1] != j - 1 || !other->frees_noted) continue;
      FreesBeforePeak frees = frees_before_peak(*other, j);
      if (frees.rise < 0) continue;
      before = std::max(before, frees.rise);
      matching->gone_at_cut[static_cast<int>(k)] = std::move(frees.blocks);
    }
    if (before < 0) continue;
    cuts.split[k] = true;
    cuts.before_cut[k] =
        std::min(plain.events[k].peak, plain.events[k - 1].live + before) - plain.start_bytes;
  }
  for (const auto& [other, matching] : steps) matching->split = cuts.split;
  return cuts;
}

int64_t held_over_plain_at(const CandidateInStep& plain, const CandidateInStep& mode, int e,
                           int e_in_mode) {
  return mode.costs.forward_kept - plain.costs.forward_kept +
         held_at_event(plain.record, mode.record, e, e_in_mode);
}

std::set<int> releasing_producers(const CandidateInStep& plain, const CandidateInStep& mode) {
  const auto& a = plain.record.watched;
  std::set<int> producers;
  for (size_t i : mode.costs.released_inputs) {
    if (i < a.size() && (a[i].freed_at < 0 || a[i].freed_at > plain.span.backward_end))
      producers.insert(a[i].producer);
  }
  return producers;
}

bool lets_go_of_outputs(const StepRecord& step, int c) {
  const int backward_begin = span_of(step, c).backward_begin;
  const auto& watched = step.candidates[c].watched;
  return std::all_of(watched.begin(), watched.end(), [&](const WatchedStorage& w) {
    return !w.output || !w.feeds_candidate || (w.freed_at >= 0 && w.freed_at <= backward_begin);
  });
}

bool shared_input(const StepRecord& plain, int c, size_t i) {
  const WatchedStorage& input = plain.candidates[c].watched[i];
  for (int t = 0; t < static_cast<int>(plain.candidates.size()); ++t) {
    if (t == c) continue;
    for (const WatchedStorage& w : plain.candidates[t].watched) {
      if (!w.output && w.producer == input.producer && w.address == input.address) return true;
    }
  }
  return false;
}

std::vector<int64_t> peak_deltas(const CandidateInStep& plain, const CandidateInStep& mode,
                                 const Matching& in_mode, bool producers_let_go) {
  const int64_t plateau = mode.costs.forward_kept - plain.costs.forward_kept;
  auto longer = [&](int k) { return held_in_segment(plain.record, mode.record, k, in_mode); };
  std::vector<int64_t> deltas;
  deltas.push_back(mode.costs.forward_peak - plain.costs.forward_peak);
  for (int k = plain.span.forward_end + 1; k <= plain.span.backward_begin; ++k) {
    const bool split = k < static_cast<int>(in_mode.split.size()) && in_mode.split[k];
    if (split) {  // before the cut, what the segment frees counts as held; after it, as gone
      deltas.push_back(
          plateau + held_in_segment(plain.record, mode.record, k, in_mode, SegmentPart::BeforeCut));
      deltas.push_back(
          plateau + held_in_segment(plain.record, mode.record, k, in_mode, SegmentPart::AfterCut));
    } else {
      deltas.push_back(plateau + longer(k));
    }
  }
  // From where its backward begins (held then, in both steps, is what the backward's peak is
  // above).
  const int64_t in_backward =
      held_over_plain_at(plain, mode, plain.span.backward_begin, mode.span.backward_begin) +
      backward_peak_of(plain, mode, producers_let_go) - plain.costs.backward_peak;
  for (int k = plain.span.backward_begin + 1; k <= plain.span.backward_end; ++k) {
    deltas.push_back(in_backward);
  }
  return deltas;
}

}  // namespace model_profiling
}  // namespace ckpt
