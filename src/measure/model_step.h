#pragma once

// One step of the any-model profiler (`profile_model`), recorded: where each candidate's forward
// and backward began and ended, what was live there, and when the storages it took or returned
// were let go of. `record_step` runs the step function once, its candidates as a `StepRun` says.

#include <ckpt/candidate.h>
#include <ckpt/memory_tracker.h>
#include <ckpt/model_profiler.h>
#include <ckpt/offload.h>

#include "autograd/host_offload.h"
#include "measure/step_measure.h"

#include <c10/core/StorageImpl.h>
#include <c10/util/intrusive_ptr.h>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <unordered_set>
#include <vector>

namespace ckpt {
namespace model_profiling {

using detail::Clock;

enum class EventKind { ForwardBegin, ForwardEnd, BackwardBegin, BackwardEnd, StepEnd };

// A boundary of a candidate's forward or backward, as a step reached it.
struct Event {
  EventKind kind;
  int candidate;      // -1 for StepEnd
  int64_t live;       // bytes live on the device there
  int64_t peak;       // the device's peak since the previous event (the segment that ends here)
  int64_t tail_peak;  // the peak since the last watched free in the segment (`peak`: none seen)
  int64_t host;       // offloaded bytes held in host memory there
  int64_t host_peak;  // the most held at once since the previous event (`host` on the CPU)
  Clock::time_point time;
};

// A storage a candidate took or returned, watched for the event at which it is freed: a mode may
// keep an input longer (a region keeps its inputs for the recompute) or let an output go sooner
// (a region's graph holds no output).
struct WatchedStorage {
  c10::weak_intrusive_ptr<c10::StorageImpl> storage;
  const c10::StorageImpl* address = nullptr;  // identity while it lives
  const void* data = nullptr;                 // its block, to find where it was freed
  int64_t bytes = 0;
  bool output = false;
  bool feeds_candidate = false;  // an output that a later candidate takes
  int freed_at = -1;             // the first event that found it freed
  int producer = -1;             // an input another candidate returned: that candidate
  bool saved = true;             // an input: saved by the plain forward (where a step found out)
};

struct CandidateRecord {
  ProfiledCandidate profiled;
  std::vector<WatchedStorage> watched;  // its inputs, then its outputs, each storage once
  /// It wrote into a tensor argument in place (noted in the `find_saved` step only): as a region
  /// it copies its arguments, so it drops none of them.
  bool writes_into_inputs = false;
  /// Markers its forward reached inside it (its parts).
  int inner_markers = 0;
  /// Noted in the `find_saved` step: the bytes of the storages its forward made and saved, and
  /// of those, per previewed policy (`StepRun::previews`), the bytes the policy would not keep.
  int64_t saved_inside_bytes = 0;
  std::vector<int64_t> policy_drops_bytes;
  /// Run offloaded: the device bytes its data took coming back, at its backward's start.
  int64_t fetched_bytes = 0;
};

// One profiled step. Shared with the hooks the step leaves on tensors, which may fire on the
// engine's device threads, and outlive the step on tensors a model keeps.
struct StepRecord {
  std::mutex mutex;
  bool open = true;
  bool wrote_outside = false;  // into tensors outside the model (put back after the step)
  MemoryTracker* tracker = nullptr;
  c10::Device device = c10::Device(c10::DeviceType::CPU);
  int64_t start_bytes = 0;
  Clock::time_point start_time;
  std::vector<CandidateRecord> candidates;
  std::vector<Event> events;

  // Where the watched blocks went inside their segments, in order, where the allocator tells
  // (the CPU's): each splits its segment's peak. Under `free_mutex` (taken after `mutex`, and
  // alone on the freeing path, which must not lock `mutex`: a free may come while it is held).
  struct Free {
    const void* data;
    int segment;   // the segment it went in (that of the next event)
    int64_t peak;  // the device's peak from the previous free or event up to it
  };
  std::mutex free_mutex;
  std::vector<Free> frees;
  std::unordered_set<const void*> watched_blocks;  // not freed yet
  int64_t peak_before_frees = -1;                  // the segment's peak up to its last free
  bool frees_noted = false;                        // the step ran under a detail::FreeWatch
  detail::HostHighWater* host_high = nullptr;      // while the step runs, where it may offload
  size_t events_noted = 0;                         // `events.size()`, for the freeing path

  void note_free(const void* data) {
    const std::lock_guard<std::mutex> lock(free_mutex);
    if (watched_blocks.erase(data) == 0) return;
    const int64_t peak = tracker->peak_bytes();
    frees.push_back({data, static_cast<int>(events_noted), peak});
    peak_before_frees = std::max(peak_before_frees, peak);
    tracker->reset_peak();
  }

  void record(EventKind kind, int candidate) {
    const std::lock_guard<std::mutex> lock(mutex);
    if (!open) return;
    const std::lock_guard<std::mutex> frees_lock(free_mutex);
    const int64_t tail = tracker->peak_bytes();
    const int64_t host = offload_stats().host_bytes;
    events.push_back({kind, candidate, tracker->current_bytes(), std::max(tail, peak_before_frees),
                      tail, host, host_high != nullptr ? host_high->restart() : host,
                      detail::clock_now(device)});
    tracker->reset_peak();
    peak_before_frees = -1;
    events_noted = events.size();
    const int at = static_cast<int>(events.size()) - 1;
    for (auto& c : candidates) {
      for (auto& w : c.watched) {
        if (w.freed_at < 0 && w.storage.expired()) w.freed_at = at;
      }
    }
  }

  // Watches `tensors`' storages for candidate `c` (as outputs: `output`). Call with the lock.
  void watch(int c, const std::vector<at::Tensor>& tensors, bool output) {
    auto& watched = candidates[c].watched;
    for (const auto& t : tensors) {
      if (!t.defined() || !t.has_storage()) continue;
      const c10::StorageImpl* address = t.storage().unsafeGetStorageImpl();
      bool seen = false;
      for (const auto& w : watched) seen = seen || w.address == address;
      if (seen) continue;
      const void* data = t.storage().data_ptr().get();
      watched.push_back({t.storage().getWeakStorageImpl(), address, data,
                         static_cast<int64_t>(t.storage().nbytes()), output});
      if (frees_noted && data != nullptr) {
        const std::lock_guard<std::mutex> lock(free_mutex);
        watched_blocks.insert(data);
      }
      if (!output) watched.back().producer = mark_fed(address);
    }
  }

  // An earlier candidate's output, alive (so the address is its identity), is fed to another:
  // returns that candidate (-1: none).
  int mark_fed(const c10::StorageImpl* address) {
    int producer = -1;
    for (size_t c = 0; c < candidates.size(); ++c) {
      for (auto& w : candidates[c].watched) {
        if (w.output && w.address == address && !w.storage.expired()) {
          w.feeds_candidate = true;
          producer = static_cast<int>(c);
        }
      }
    }
    return producer;
  }
};

// Steps that measure the "recomputed" options, each running every candidate checkpointed. A
// step measures chains of `length`: a candidate whose inputs come from no recomputable output
// starts a chain (depth 1); one whose inputs come from outputs of depth below `length` continues
// it (the deepest plus one), and ends it at `length` where it was not measured at that depth
// before; the rest (which takes such an output) runs checkpointed and runs the chain again in its
// backward. Every region drops the recomputable outputs it takes; with `keeps_skips`, those of a
// chain's start only where it is the first to take one (later takers keep theirs).
struct RecomputeTrial {
  RecomputeTrial(std::vector<bool> copies_inputs, int length, bool keeps_skips)
      : length(length),
        keeps_skips(keeps_skips),
        copies_inputs(std::move(copies_inputs)),
        measured(this->copies_inputs.size()),
        consumers(this->copies_inputs.size()),
        takers(this->copies_inputs.size()),
        let_go(this->copies_inputs.size()) {}
  int length;                                 // of the chains this trial measures
  bool keeps_skips;                           // chain starts: recomputed for their first taker
  std::vector<bool> copies_inputs;            // by candidate: writes into its arguments
  std::vector<bool> measured;                 // by candidate: at the end of a chain so far
  std::vector<std::set<int>> consumers;       // by candidate: those that dropped its outputs
  std::vector<std::set<int>> takers;          // by candidate: those that took its outputs
  std::vector<bool> let_go;                   // by candidate: its outputs recomputable in a step
  std::vector<int> depth;                     // by candidate, in the current step (0: kept outputs)
  std::vector<int> first_taker;               // by candidate, in the current step (-1: none yet)
  std::vector<std::map<int, int>> producers;  // by candidate: the depth of each it dropped from
  detail::RecomputableOutputs outputs;        // the current step's

  void start_step() {
    depth.assign(measured.size(), 0);
    first_taker.assign(measured.size(), -1);
    producers.assign(measured.size(), {});
    outputs = detail::RecomputableOutputs();
  }
  // At candidate `c`'s start, before the profiler replaces its inputs.
  void request(int c, const std::vector<at::Tensor>& inputs, detail::RegionRequest& request) {
    std::vector<int> from;
    request.input_sources = outputs.sources_for(inputs, from);
    for (const int p : from) {
      if (p >= 0) takers[p].insert(c);
    }
    keep_skips(c, from, request.input_sources);
    if (static_cast<size_t>(c) >= measured.size()) return;
    if (copies_inputs[c]) {  // it keeps copies of its arguments: dropping them would free nothing
      request.input_sources.clear();
      from.clear();
    }
    int deepest = 0;
    for (int p : from) {
      if (p < 0) continue;
      consumers[static_cast<size_t>(p)].insert(c);
      producers[c][p] = depth[p];
      deepest = std::max(deepest, depth[p]);
    }
    depth[c] = depth_after(c, deepest);
    if (depth[c] == 0) return;
    request.recomputable_outputs = true;
    let_go[c] = true;
    if (depth[c] == length) measured[c] = true;
  }

  // Candidate c's depth in a chain where the deepest producer it drops outputs of is at
  // `deepest`: one more, or 0 (it keeps its outputs) past the length or where it ended a chain of
  // the length already.
  int depth_after(size_t c, int deepest) const {
    if (deepest >= length || (deepest + 1 == length && measured[c])) return 0;
    return deepest + 1;
  }

  // Whether one more step would end a chain: `request` replayed on the takers this trial's steps
  // saw, so that the step that would end none needn't run. Where a candidate would let its outputs
  // go that no step of the trial let go (its takers unseen), or skips are kept (whether a taker
  // drops then depends on the order it takes them in), the step runs.
  bool ends_a_chain_next() const {
    if (keeps_skips) return true;
    const size_t n = measured.size();
    std::vector<std::vector<int>> producers_of(n);
    for (size_t p = 0; p < n; ++p) {
      for (const int c : takers[p]) {
        if (c >= 0 && static_cast<size_t>(c) < n) producers_of[c].push_back(static_cast<int>(p));
      }
    }
    std::vector<int> next(n, 0);
    for (size_t c = 0; c < n; ++c) {
      int deepest = 0;
      if (!copies_inputs[c]) {
        for (const int p : producers_of[c]) deepest = std::max(deepest, next[p]);
      }
      next[c] = depth_after(c, deepest);
      if (next[c] == 0) continue;
      if (!let_go[c] || next[c] == length) return true;
    }
    return false;
  }

 private:
  // As `PlannedModel` runs a "recomputed, skips kept" candidate: the first candidate that takes
  // one of its outputs drops them, later ones keep theirs (`from`: -1 there).
  void keep_skips(int c, std::vector<int>& from,
                  std::vector<std::shared_ptr<const detail::RecomputeSource>>& sources) {
    if (!keeps_skips) return;
    for (size_t i = 0; i < from.size(); ++i) {
      const int p = from[i];
      if (p < 0 || depth[p] != 1) continue;
      int& first = first_taker[p];
      if (first < 0) first = c;
      if (first == c) continue;
      sources[i] = nullptr;
      from[i] = -1;
    }
  }
};

// How a step runs its candidates: each in `mode` (none: kept), but those `kept` marks (by
// candidate), and the markers inside those in `parts` (none: plainly); with `trial`, as a step
// of the "recomputed" trial; with `find_saved` (every candidate kept), noting which inputs each
// candidate's forward saves (`WatchedStorage::saved`) and, for each policy in `previews`, what it
// would not keep of that (`CandidateRecord::policy_drops_bytes`); with `forward_only`, no backward.
struct StepRun {
  std::optional<CheckpointOptions> mode;
  std::vector<bool> kept{};
  RecomputeTrial* trial = nullptr;
  bool find_saved = false;
  std::optional<CheckpointOptions> parts{};
  bool forward_only = false;
  std::vector<SelectivePolicy> previews{};
};

// The environment of the profiled steps.
struct StepSetup {
  std::shared_ptr<torch::nn::Module> model;
  std::function<at::Tensor()> loss_fn;
  const detail::CandidateNames* names;
  MemoryTracker* tracker;
  c10::Device device;
  bool count_parameter_gradients;
  // The step writes tensors outside the model (the statistics of a module its forward reaches
  // without registering it): each profiled step puts them back (the first step finds out).
  bool watch_outside = true;
};

// One step run as `run` says, from the gradients a step starts from.
std::shared_ptr<StepRecord> record_step(const StepSetup& setup, StepRun run);

// The device of the model's first parameter or buffer not on the CPU (the CPU where none is).
c10::Device device_of(const torch::nn::Module& model);

}  // namespace model_profiling
}  // namespace ckpt
