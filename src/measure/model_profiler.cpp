#include <ckpt/candidate.h>
#include <ckpt/memory_tracker.h>
#include <ckpt/model_profiler.h>
#include <ckpt/offload.h>

#include "autograd/buffer_guard.h"
#include "autograd/graph.h"
#include "autograd/host_offload.h"
#include "autograd/outside_state.h"
#include "autograd/rng_state.h"
#include "autograd/saved_tensor_hooks.h"
#include "autograd/step_rollback.h"
#include "compat/torch_compat.h"
#include "measure/free_watch.h"
#include "measure/policy_preview.h"
#include "measure/step_measure.h"

#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/autograd/saved_variable_hooks.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>
#include <unordered_set>
#include <utility>

namespace ckpt {

TensorShape TensorShape::of(const at::Tensor& tensor) {
  if (!tensor.defined()) return {{}, c10::ScalarType::Undefined, c10::Device(c10::DeviceType::CPU)};
  return {tensor.sizes().vec(), tensor.scalar_type(), tensor.device(), tensor.requires_grad()};
}

bool TensorShape::holds(const at::Tensor& tensor) const {
  if (!tensor.defined()) return dtype == c10::ScalarType::Undefined;
  if (tensor.scalar_type() != dtype || tensor.device() != device) return false;
  if (tensor.dim() != static_cast<int64_t>(sizes.size())) return false;
  if (tensor.requires_grad() && !requires_grad) return false;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (tensor.size(static_cast<int64_t>(d)) > sizes[d]) return false;
  }
  return true;
}

std::string TensorShape::to_string() const {
  if (dtype == c10::ScalarType::Undefined) return "an undefined tensor";
  std::ostringstream out;
  out << c10::toString(dtype) << "[";
  for (size_t d = 0; d < sizes.size(); ++d) out << (d ? ", " : "") << sizes[d];
  out << "] on " << device;
  if (requires_grad) out << ", requiring grad";
  return out.str();
}

namespace detail {

CandidateNames::CandidateNames(const torch::nn::Module& model) {
  for (const auto& item : model.named_modules("", /*include_self=*/true)) {
    paths_.emplace(item.value().get(), item.key());
  }
}

std::string CandidateNames::resolve(const std::string& name,
                                    const torch::nn::Module* module) const {
  if (module == nullptr) return name;
  const auto found = paths_.find(module);
  TORCH_CHECK(found != paths_.end(), "ckpt::candidate: the module ", module->name(),
              " is not a submodule of the planned model. Plan the module that contains it, or "
              "register it (register_module) in its parent.");
  if (name.empty()) return found->second;
  return found->second.empty() ? name : found->second + "." + name;
}

}  // namespace detail

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

using detail::StorageSet;

// What a plain forward saved: the storages the current candidate's saved tensors use, and the
// tensors themselves, passed through for a backward the step function runs inside the forward (a
// gradient penalty) and let go of when the step ends (`~StepRecorder`): a saved output holds its
// own graph alive, a cycle that, with no backward after the forward, nothing else breaks.
struct SavedNotes {
  StorageSet storages;
  std::vector<at::Tensor> tensors;
};

// Hooks that pass a saved tensor through and note its storage.
class NotingHooks final : public torch::autograd::SavedVariableHooks {
 public:
  explicit NotingHooks(std::shared_ptr<SavedNotes> notes) : notes_(std::move(notes)) {}
  void call_pack_hook(const at::Tensor& tensor) override {
    if (tensor.defined() && tensor.has_storage())
      notes_->storages.insert(tensor.storage().unsafeGetStorageImpl());
    index_ = notes_->tensors.size();
    notes_->tensors.push_back(tensor);
  }
  at::Tensor call_unpack_hook() override {
    TORCH_CHECK(index_ < notes_->tensors.size(),
                "ckpt::profile_model: the graph of the step that finds the candidates is used "
                "after its forward; return the loss without keeping that graph elsewhere.");
    return notes_->tensors[index_];
  }

 private:
  std::shared_ptr<SavedNotes> notes_;
  size_t index_ = 0;
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

// Runs the candidates of a step as `StepRun` says and records the step's events.
class StepRecorder final : public detail::CandidateRunner {
 public:
  StepRecorder(const detail::CandidateNames& names, StepRun run, std::shared_ptr<StepRecord> record)
      : names_(names), run_(std::move(run)), record_(std::move(record)) {}
  // The step is over: the saved tensors passed through are let go of.
  ~StepRecorder() override { saved_->tensors.clear(); }
  StepRecorder(const StepRecorder&) = delete;
  StepRecorder& operator=(const StepRecorder&) = delete;

  // The groups of the step's offloaded regions, while its forward runs (none: after it).
  void take_groups_from(detail::ManualOffloadScope* offloads) { offloads_ = offloads; }

  std::optional<CheckpointOptions> begin(const std::string& name, const torch::nn::Module* module,
                                         std::vector<at::Tensor>& inputs,
                                         detail::RegionRequest& request) override {
    const std::string resolved = names_.resolve(name, module);
    TORCH_CHECK(seen_.insert(resolved).second, "ckpt::candidate: \"", resolved,
                "\" is reached twice in one step. A candidate is one call: give each call its "
                "own name (ckpt::candidate(\"name\", fn, args...)), or mark the block that holds "
                "both calls instead.");
    const int index = add_candidate(resolved, inputs);
    if (run_.trial != nullptr) run_.trial->request(index, inputs, request);
    record_->record(EventKind::ForwardBegin, index);
    for (auto& t : inputs) {
      if (!t.defined() || !t.requires_grad()) continue;
      t = t.alias();  // its gradient is complete once the candidate's backward is done with it
      t.register_hook([record = record_, index](const at::Tensor&) {
        record->record(EventKind::BackwardEnd, index);
      });
    }
    current_ = index;
    if (run_.find_saved) {
      saved_->storages.clear();
      saving_.emplace([saved = saved_] { return std::make_unique<NotingHooks>(saved); });
      if (!run_.previews.empty()) {
        if (!preview_) preview_.emplace(run_.previews);
        previewing_.emplace(*preview_);
      }
      for (const auto& t : inputs) {  // version counters hold no data
        if (t.defined())
          input_versions_.emplace_back(t._version(), torch::autograd::impl::version_counter(t));
      }
    }
    const bool kept = static_cast<size_t>(index) < run_.kept.size() && run_.kept[index];
    offloaded_ = !kept && run_.mode && run_.mode->offload();
    if (offloads_ != nullptr) offloads_->take_last();  // a group that finished before it
    if (kept) return std::nullopt;
    request.inner_candidates = run_.parts;
    return run_.mode;
  }

  void end(std::vector<at::Tensor>& outputs, const detail::RegionRequest& request) override {
    const int index = current_;
    if (saving_) {
      previewing_.reset();
      if (preview_) note_policy_drops(index, outputs);
      note_saved_inputs(index);
      bool written = false;
      for (const auto& [version, counter] : input_versions_) {
        written = written || counter.current_version() != version;
      }
      input_versions_.clear();
      const std::lock_guard<std::mutex> lock(record_->mutex);
      record_->candidates[index].writes_into_inputs = written;
    }
    if (run_.trial != nullptr) run_.trial->outputs.add(index, outputs, request);
    record_->record(EventKind::ForwardEnd, index);
    {
      const std::lock_guard<std::mutex> lock(record_->mutex);
      record_->watch(index, outputs, /*output=*/true);
      record_->candidates[index].inner_markers = request.inner_markers;
    }
    for (auto& t : outputs) {
      if (!t.defined() || !t.requires_grad()) continue;
      t.register_hook([record = record_, index](const at::Tensor&) {
        record->record(EventKind::BackwardBegin, index);
      });
    }
    if (offloaded_ && offloads_ != nullptr) bring_back_at_backward(index, outputs);
  }

  void abandon() noexcept override {
    previewing_.reset();
    saving_.reset();
  }

  // Whether the step's backward would measure nothing: a step that finds what forwards do, or a
  // step of a "recomputed" trial whose forward ended no chain (`run_trials` drops such a step).
  bool needs_no_backward() const {
    const RecomputeTrial* trial = run_.trial;
    return run_.forward_only ||
           (trial != nullptr && std::find(trial->depth.begin(), trial->depth.end(),
                                          trial->length) == trial->depth.end());
  }

 private:
  // What each previewed policy would not keep of what the candidate's forward made and saved.
  void note_policy_drops(int index, const std::vector<at::Tensor>& outputs) {
    const detail::PolicyPreview::Made made = preview_->take();
    StorageSet outputs_made;  // its outputs: every mode keeps them
    for (const auto& t : outputs) outputs_made.insert(detail::storage_of(t));
    int64_t inside = 0;
    std::vector<int64_t> drops(made.kept.size());
    for (const c10::StorageImpl* storage : saved_->storages) {
      if (made.storages.count(storage) == 0 || outputs_made.count(storage) > 0) continue;
      const auto bytes = static_cast<int64_t>(storage->nbytes());
      inside += bytes;
      for (size_t p = 0; p < drops.size(); ++p) {
        if (made.kept[p].count(storage) == 0) drops[p] += bytes;
      }
    }
    const std::lock_guard<std::mutex> lock(record_->mutex);
    record_->candidates[index].saved_inside_bytes = inside;
    record_->candidates[index].policy_drops_bytes = std::move(drops);
  }

  void note_saved_inputs(int index) {
    saving_.reset();
    const std::lock_guard<std::mutex> lock(record_->mutex);
    for (auto& w : record_->candidates[index].watched) {
      if (!w.output) w.saved = saved_->storages.count(w.address) > 0;
    }
  }

  // Its offloaded data comes back where its backward begins, as `PlannedModel` brings it back
  // (after the event, in the backward's first segment); the bytes that takes are its
  // `fetched_bytes`.
  void bring_back_at_backward(int index, const std::vector<at::Tensor>& outputs) {
    const std::weak_ptr<detail::OffloadGroup> group = offloads_->take_last();
    detail::at_first_gradient(outputs, [record = record_, group, index] {
      const std::shared_ptr<detail::OffloadGroup> data = group.lock();
      if (!data) return;
      const std::lock_guard<std::mutex> lock(record->mutex);
      const int64_t before = record->tracker->current_bytes();
      const int64_t bytes = data->prefetch();
      if (!record->open) return;
      // The device's count, with its blocks' rounding; at least the data's own bytes, where the
      // allocator let go of blocks it held for other streams in the same call.
      const int64_t rise = record->tracker->current_bytes() - before;
      int64_t& fetched = record->candidates[index].fetched_bytes;
      fetched = std::max({fetched, rise, bytes});
    });
  }

  int add_candidate(const std::string& name, const std::vector<at::Tensor>& inputs) {
    CandidateRecord c;
    c.profiled.name = name;
    for (const auto& t : inputs) c.profiled.inputs.push_back(TensorShape::of(t));
    const std::lock_guard<std::mutex> lock(record_->mutex);
    record_->candidates.push_back(std::move(c));
    const int index = static_cast<int>(record_->candidates.size()) - 1;
    record_->watch(index, inputs, /*output=*/false);
    return index;
  }

  const detail::CandidateNames& names_;
  StepRun run_;
  std::shared_ptr<StepRecord> record_;
  std::unordered_set<std::string> seen_;
  int current_ = -1;
  bool offloaded_ = false;  // the current candidate runs as an offloaded region
  detail::ManualOffloadScope* offloads_ = nullptr;
  std::shared_ptr<SavedNotes> saved_ = std::make_shared<SavedNotes>();
  // In the `find_saved` step: the current candidate's tensor arguments' versions at its begin.
  std::vector<std::pair<int64_t, c10::VariableVersion>> input_versions_;
  std::optional<detail::SavedTensorHooksScope> saving_;
  std::optional<detail::PolicyPreview> preview_;
  std::optional<detail::DispatchModeGuard> previewing_;
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

}  // namespace model_profiling

void detail::check_step_loss(const at::Tensor& loss) {
  TORCH_CHECK(loss.defined() && loss.numel() == 1 && loss.requires_grad(),
              "ckpt::PlannedModel: the step function must return the step's loss: one number "
              "that requires grad (got ",
              loss.defined() ? TensorShape::of(loss).to_string() : "an undefined tensor",
              loss.defined() && !loss.requires_grad() ? " that doesn't require grad" : "", ").");
}

std::optional<CheckpointOptions> detail::candidate_region(const StorageMode& mode,
                                                          const StorageSettings& settings,
                                                          c10::Device device,
                                                          bool preserve_rng_state) {
  std::optional<CheckpointOptions> region = mode.region_on(settings, device);
  if (!region) return std::nullopt;
  region->preserve_rng_state(preserve_rng_state);
  if (region->offload()) {
    region->offload_options(OffloadOptions(region->offload_options()).look_ahead(0));
  }
  return region;
}

namespace model_profiling {

// The leaves a backward from `loss` accumulates into that are not parameters of `model`.
std::vector<at::Tensor> leaves_outside(const torch::nn::Module& model, const at::Tensor& loss) {
  std::unordered_set<const c10::TensorImpl*> parameters;
  for (const auto& p : model.parameters()) parameters.insert(p.unsafeGetTensorImpl());
  std::vector<at::Tensor> outside;
  for (auto& leaf : detail::leaves_reached(loss)) {
    if (parameters.count(leaf.unsafeGetTensorImpl()) == 0) outside.push_back(std::move(leaf));
  }
  return outside;
}

// `watch`, where given, watches the forward only: the backward's writes outside the model are
// the gradients of leaves, put back below (watched, their copies would count in every segment).
void run_loss_and_backward(const StepSetup& setup, StepRecorder& recorder,
                           detail::OutsideStateWatch* watch) {
  at::Tensor loss;
  {
    const detail::CandidateRunnerScope scope(&recorder);
    const at::AutoGradMode grad_mode(true);
    // As PlannedModel::run forwards: each offloaded candidate's data comes back where its
    // runner says, never ahead by itself.
    detail::ManualOffloadScope offloads;
    recorder.take_groups_from(&offloads);
    // What PlannedModel::run holds through the forward, held here too: the plan counts it.
    detail::StepRollback as_run(setup.model);
    std::optional<detail::DispatchModeGuard> watching;
    if (watch) watching.emplace(*watch);
    loss = setup.loss_fn();
    as_run.dismiss();
    recorder.take_groups_from(nullptr);
  }
  detail::check_step_loss(loss);
  if (recorder.needs_no_backward()) return;
  // A profiled step's backward must leave no gradient behind: the model's are swapped by the
  // caller; those of leaves outside it (an input that requires grad, a loss's own parameters)
  // are found in the graph and put back here.
  const detail::SwappedGradients outside(leaves_outside(*setup.model, loss));
  loss.backward();
}

// One step run as `run` says, from the gradients a step starts from.
std::shared_ptr<StepRecord> record_step(const StepSetup& setup, StepRun run) {
  const detail::SwappedGradients grads({setup.model},
                                       setup.count_parameter_gradients
                                           ? detail::SwappedGradients::Start::None
                                           : detail::SwappedGradients::Start::ZeroBuffers);
  const detail::BufferGuard buffers({setup.model});
  std::optional<detail::OutsideStateWatch> outside;
  if (setup.watch_outside) {
    outside.emplace(std::vector<at::Tensor>{},
                    std::vector<std::shared_ptr<torch::nn::Module>>{setup.model});
  }
  auto record = std::make_shared<StepRecord>();
  record->tracker = setup.tracker;
  record->device = setup.device;
  StepRecorder recorder(*setup.names, std::move(run), record);
  std::optional<detail::FreeWatch> frees;
  std::optional<detail::HostHighWater> host_high;
  if (setup.device.is_cpu()) {
    record->frees_noted = true;
    frees.emplace([step = record.get()](const void* data) { step->note_free(data); });
  } else {
    record->host_high = &host_high.emplace();
  }
  record->start_time = detail::clock_now(setup.device);
  setup.tracker->reset_peak();
  record->start_bytes = setup.tracker->current_bytes();
  run_loss_and_backward(setup, recorder, outside ? &*outside : nullptr);
  record->record(EventKind::StepEnd, -1);
  record->wrote_outside = outside && outside->saw_writes();
  const std::lock_guard<std::mutex> lock(record->mutex);
  record->open = false;
  record->host_high = nullptr;
  return record;
}

c10::Device device_of(const torch::nn::Module& model) {
  for (const auto& p : model.parameters()) {
    if (!p.device().is_cpu()) return p.device();
  }
  for (const auto& b : model.buffers()) {
    if (!b.device().is_cpu()) return b.device();
  }
  return c10::Device(c10::DeviceType::CPU);
}

// Where a candidate's forward and backward begin and end among a step's events: its backward
// begins with the first gradient of its outputs and ends with the last of its inputs' (at the
// step's end where no input needs one); `backward_begin` is -1 where no output got a gradient.
struct Span {
  int forward_begin = -1, forward_end = -1, backward_begin = -1, backward_end = -1;
};

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
int profile_index(const std::vector<bool>& split, int k) {
  int index = k;
  for (int i = 0; i <= k && i < static_cast<int>(split.size()); ++i) index += split[i] ? 1 : 0;
  return index;
}

// The profile's index of the first part of plain segment k (the one before the cut, where cut).
int first_part(const std::vector<bool>& split, int k) {
  const bool cut = k < static_cast<int>(split.size()) && split[k];
  return profile_index(split, k) - (cut ? 1 : 0);
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

// One candidate in one step: what it recorded and where its parts begin and end.
struct CandidateInStep {
  const CandidateRecord& record;
  Span span;
  CandidateCosts costs;
};

// What the mode holds over the plain step at event `e` of the plain step (`e_in_mode` in the
// mode's step): what its forward kept less (or more), and its storages still held there.
int64_t held_over_plain_at(const CandidateInStep& plain, const CandidateInStep& mode, int e,
                           int e_in_mode) {
  return mode.costs.forward_kept - plain.costs.forward_kept +
         held_at_event(plain.record, mode.record, e, e_in_mode);
}

// The candidates that made the inputs the mode's step let go of inside its backward while the
// plain step held them past it (-1: not a candidate's output). The plain step's holder was the
// saved graph of the candidate that made them, and in the mode's step it ran in the mode too and
// held nothing.
std::set<int> releasing_producers(const CandidateInStep& plain, const CandidateInStep& mode) {
  const auto& a = plain.record.watched;
  std::set<int> producers;
  for (size_t i : mode.costs.released_inputs) {
    if (i < a.size() && (a[i].freed_at < 0 || a[i].freed_at > plain.span.backward_end))
      producers.insert(a[i].producer);
  }
  return producers;
}

// Whether candidate `c`'s outputs that other candidates take went before its backward began in
// `step`: its region's graph held none of them (a checkpointed region saves its inputs only).
bool lets_go_of_outputs(const StepRecord& step, int c) {
  const int backward_begin = span_of(step, c).backward_begin;
  const auto& watched = step.candidates[c].watched;
  return std::all_of(watched.begin(), watched.end(), [&](const WatchedStorage& w) {
    return !w.output || !w.feeds_candidate || (w.freed_at >= 0 && w.freed_at <= backward_begin);
  });
}

// Whether the plain step's input `i` of candidate `c` is taken by another candidate too.
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

// A mode's bytes over the plain step, in each segment of the candidate's window (the plain step's
// segments from its forward to the end of its backward): its forward's peak, then what it keeps
// less (or more) plus the inputs it keeps longer, then its backward's peak on top.
std::vector<int64_t> peak_deltas(const CandidateInStep& plain, const CandidateInStep& mode,
                                 const Matching& in_mode, bool producers_let_go = false) {
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

bool same_candidates(const StepRecord& a, const StepRecord& b) {
  return std::equal(
      a.candidates.begin(), a.candidates.end(), b.candidates.begin(), b.candidates.end(),
      [](const auto& x, const auto& y) { return x.profiled.name == y.profiled.name; });
}

bool same_shape(const TensorShape& a, const TensorShape& b) {
  return a.sizes == b.sizes && a.dtype == b.dtype && a.device == b.device &&
         a.requires_grad == b.requires_grad;
}

// The candidates of two steps with the same names took tensors of the same shapes: a step
// function that reads its next batch itself gives each profiling step another.
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

// Each "producers let go" option excludes every option of its producers that holds its outputs
// until its own backward (`lets_go_towards`; `first_takers`, by candidate).
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

// Runs a trial's steps (each with every candidate checkpointed) until every candidate ended a
// chain in one, or a step ends none.
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

// Adds the "recomputed" options to each candidate that a trial step ended a chain with, whose
// outputs some region took and let go of, and whose chain's producers offer theirs (from trials
// whose chains start keeping skips, only where a start has later takers). Then excludes the pairs
// of producer and taker options that were not measured together.
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

// The takers of each candidate's outputs that run plainly without saving one of them (a
// decoder's concatenation of a skip), as the step that noted what each forward saves found them.
std::vector<std::set<int>> unsaving_takers(const StepRecord& found) {
  std::vector<std::set<int>> takers(found.candidates.size());
  for (size_t t = 0; t < found.candidates.size(); ++t) {
    for (const auto& w : found.candidates[t].watched) {
      if (!w.output && w.producer >= 0 && !w.saved) takers[w.producer].insert(static_cast<int>(t));
    }
  }
  return takers;
}

// The candidates a "takers kept" step runs plainly: every such taker.
std::vector<bool> kept_takers(const std::vector<std::set<int>>& takers) {
  std::vector<bool> kept(takers.size(), false);
  for (const auto& of_one : takers) {
    for (int t : of_one) kept[t] = true;
  }
  return kept;
}

bool lower_somewhere(const std::vector<int64_t>& deltas, const std::vector<int64_t>& than) {
  for (size_t i = 0; i < deltas.size() && i < than.size(); ++i) {
    if (deltas[i] < than[i]) return true;
  }
  return false;
}

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

// Each "takers kept" option excludes every option but "stored" of the takers it was measured with.
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

// Measures `run`'s mode (`region`) on the candidates `run.measured` marks, the others kept, into
// `modes`; and where some candidates are takers to keep (`kept`), once more beside them kept, into
// `with_kept_takers`.
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

// What a `ModelProfiler` keeps between its calls: the steps measured so far. (The profiler's
// helpers live in a named namespace, not an anonymous one, because this struct holds their types.)
struct ModelProfiler::State {
  using StepRecord = model_profiling::StepRecord;
  using ModeRun = model_profiling::ModeRun;
  using TrialRun = model_profiling::TrialRun;

  std::shared_ptr<torch::nn::Module> model;
  ModelProfileOptions options;
  c10::Device device;
  detail::CandidateNames names;
  bool watch_outside = true;
  std::shared_ptr<StepRecord> plain;
  std::vector<std::set<int>> takers;  // unsaving takers, as the first (untimed) forward saw them
  std::vector<bool> copies_inputs;    // by candidate: writes into its arguments
  // The policy modes the first forward previewed, and by candidate what it saved inside itself
  // and what each of those modes would not keep of that.
  std::vector<std::string> previewed;
  std::vector<int64_t> saved_inside;
  std::vector<std::vector<int64_t>> policy_drops;
  std::vector<ModeRun> modes, with_kept_takers;
  std::optional<CheckpointOptions> trial_region;  // where the "recomputed" chains are measured
  std::vector<TrialRun> runs;
  std::vector<std::set<int>> consumers, takers_seen;
  bool far_takers = false;
  int chains = 0;  // the longest chain measured

  State(std::shared_ptr<torch::nn::Module> model, ModelProfileOptions options, c10::Device device)
      : model(std::move(model)), options(std::move(options)), device(device), names(*this->model) {}
};

namespace model_profiling {

// One call's worth of profiling: a tracker on this thread, and the random state put back at its
// end (the steps each start from it).
struct ProfilingCall {
  MemoryTracker tracker;
  StepSetup setup;
  detail::RngStash rng;

  ProfilingCall(ModelProfiler::State& state, const std::function<at::Tensor()>& loss_fn)
      : tracker(state.device,
                state.device.is_cpu() ? MemoryScope::CallingThread : MemoryScope::Process),
        setup{state.model,        loss_fn,      &state.names,
              &tracker,           state.device, state.options.count_parameter_gradients(),
              state.watch_outside},
        rng(state.model->parameters(), detail::infer_device_type(state.model->parameters())) {}
  ~ProfilingCall() { rng.restore(); }
  ProfilingCall(const ProfilingCall&) = delete;
  ProfilingCall& operator=(const ProfilingCall&) = delete;
};

// The plain steps: the forward that finds the candidates and what each forward saves (it warms
// the forward's caches too), then the step measured.
void measure_plain(ModelProfiler::State& s, ProfilingCall& call) {
  const bool hooks = detail::saved_tensor_hooks_available();
  std::vector<SelectivePolicy> previews;
  if (hooks) {
    for (const StorageMode& mode : s.options.storage_modes().all()) {
      const std::optional<CheckpointOptions> region =
          detail::candidate_region(mode, StorageSettings{s.options.selective_policy()}, s.device,
                                   s.options.preserve_rng_state());
      if (!region || !region->policy() || region->offload()) continue;
      s.previewed.push_back(mode.name);
      previews.push_back(region->policy());
    }
  }
  const auto found = record_step(
      call.setup, {std::nullopt, {}, nullptr, hooks, {}, /*forward_only=*/true, previews});
  s.watch_outside = call.setup.watch_outside = found->wrote_outside;  // a dispatch mode costs
  call.rng.restore();
  s.plain = record_step(call.setup, {std::nullopt});
  const bool same = same_candidates(*found, *s.plain);
  if (same) check_same_inputs(*s.plain, *found, "stored (the first, unmeasured forward)");
  s.takers =
      same ? unsaving_takers(*found) : std::vector<std::set<int>>(s.plain->candidates.size());
  TORCH_CHECK(!s.plain->candidates.empty(),
              "ckpt::PlannedModel: the step reached no candidate. Mark the blocks the planner may "
              "choose for in the model's forward: x = ckpt::candidate(block, x);");
  // A region whose function writes into its argument keeps its activations the first time, and
  // its call site copies the argument from then on (measure_mode measures such a step again):
  // its copy is kept anyway, so it drops no argument in the recompute trials.
  s.copies_inputs.assign(s.plain->candidates.size(), false);
  if (!same) return;
  for (size_t c = 0; c < s.copies_inputs.size(); ++c) {
    s.copies_inputs[c] = found->candidates[c].writes_into_inputs;
    s.saved_inside.push_back(found->candidates[c].saved_inside_bytes);
    s.policy_drops.push_back(found->candidates[c].policy_drops_bytes);
  }
}

// Whether the first forward showed that policy mode `mode` would keep all but a negligible share
// of what each candidate's plain forward made and saved (a policy that keeps every convolution's
// output, on a ResNet: what it recomputes is BatchNorm's per-channel statistics). Its step could
// then offer no option worth the step: a mode is offered where it keeps less, and this one keeps
// at most 1% less anywhere (where it runs, its region also keeps its arguments).
bool keeps_about_as_much(const ModelProfiler::State& s, const std::string& mode) {
  const auto found = std::find(s.previewed.begin(), s.previewed.end(), mode);
  if (found == s.previewed.end() || s.policy_drops.empty()) return false;
  const auto p = static_cast<size_t>(found - s.previewed.begin());
  for (size_t c = 0; c < s.policy_drops.size(); ++c) {
    if (p >= s.policy_drops[c].size() || 100 * s.policy_drops[c][p] > s.saved_inside[c])
      return false;
  }
  return true;
}

// One step per storage mode (more where it offloads, or where candidates have parts).
void measure_modes(ModelProfiler::State& s, ProfilingCall& call) {
  const StorageSettings settings{s.options.selective_policy()};
  const std::vector<bool> kept = kept_takers(s.takers);
  for (const StorageMode& mode : s.options.storage_modes().all()) {
    std::optional<CheckpointOptions> region =
        detail::candidate_region(mode, settings, s.device, s.options.preserve_rng_state());
    if (!region || keeps_about_as_much(s, mode.name)) continue;
    const std::vector<std::vector<bool>> groups =
        measured_together(*s.plain, region->offload(), s.options.host_budget_bytes());
    for (const std::vector<bool>& group : groups) {
      ModeRun run{mode.name, !region->offload(), nullptr, {}, group};
      measure_mode(call.setup, *s.plain, call.rng, *region, kept, run, s.modes, s.with_kept_takers);
    }
    // Candidates with parts marked inside them: checkpointed with their parts checkpointed too.
    if (mode.name != kCheckpointedMode || region->offload()) continue;
    std::vector<bool> with_parts(s.plain->candidates.size());
    for (size_t c = 0; c < with_parts.size(); ++c)
      with_parts[c] = s.plain->candidates[c].inner_markers > 0;
    if (std::find(with_parts.begin(), with_parts.end(), true) == with_parts.end()) continue;
    ModeRun run{mode.name, true, nullptr, {}, with_parts, /*parts=*/true};
    measure_mode(call.setup, *s.plain, call.rng, *region, kept, run, s.modes, s.with_kept_takers);
  }
  const bool checkpointed = std::any_of(s.modes.begin(), s.modes.end(), [](const ModeRun& m) {
    return m.name == kCheckpointedMode && !m.parts;
  });
  if (s.options.recompute_outputs() && checkpointed) {
    s.trial_region = detail::candidate_region(
        s.options.storage_modes().at(kCheckpointedMode, "ckpt::profile_model"), settings, s.device,
        s.options.preserve_rng_state());
  }
}

// The trial steps of chains of `length`. Where a candidate's outputs go to one beyond the longest
// chain from it (a U-Net encoder's skip, to its decoder block), each length is measured twice:
// chains whose start lets every taker drop its outputs, and chains whose start keeps them for its
// later takers. Nearer takers (a residual block's shortcut) take part in the chain's own
// recompute.
void measure_chains(ModelProfiler::State& s, ProfilingCall& call, int length) {
  // Measured beside what is kept, which takes it only once every step of the length has run: a
  // step that fails (the model reached other candidates) leaves the profiler as it was.
  std::vector<TrialRun> runs = s.runs;
  std::vector<std::set<int>> consumers = s.consumers, takers_seen = s.takers_seen;
  bool far_takers = s.far_takers;
  const auto trials = [&](bool keeps_skips) {
    RecomputeTrial trial(s.copies_inputs, length, keeps_skips);
    run_trials(call.setup, *s.plain, *s.trial_region, call.rng, trial, runs);
    for (size_t c = 0; c < consumers.size(); ++c) {
      consumers[c].insert(trial.consumers[c].begin(), trial.consumers[c].end());
      takers_seen[c].insert(trial.takers[c].begin(), trial.takers[c].end());
      far_takers = far_takers || (!takers_seen[c].empty() &&
                                  *takers_seen[c].rbegin() >
                                      static_cast<int>(c) + s.options.max_recompute_chain());
    }
  };
  trials(false);
  if (far_takers) trials(true);
  s.runs = std::move(runs);
  s.consumers = std::move(consumers);
  s.takers_seen = std::move(takers_seen);
  s.far_takers = far_takers;
  s.chains = length;
}

}  // namespace model_profiling

ModelProfiler::ModelProfiler(const std::shared_ptr<torch::nn::Module>& model,
                             const std::function<at::Tensor()>& loss_fn,
                             const ModelProfileOptions& options) {
  using namespace model_profiling;
  TORCH_CHECK(model != nullptr, "ckpt::profile_model: the model is empty (a null module holder).");
  TORCH_CHECK(options.max_recompute_chain() >= 1,
              "ckpt::profile_model: max_recompute_chain must be at least 1 (a recomputed "
              "candidate's own inputs kept); got ",
              options.max_recompute_chain(), ". Turn the mode off with recompute_outputs(false).");
  const c10::Device device = device_of(*model);
  TORCH_CHECK(MemoryTracker::can_measure(device),
              "ckpt::PlannedModel: can't measure the memory of ", device,
              " with this LibTorch; plan on the CPU or on a device whose memory it counts.");
  state_ = std::make_unique<State>(model, options, device);
  ProfilingCall call(*state_, loss_fn);
  measure_plain(*state_, call);
  measure_modes(*state_, call);
  state_->consumers.resize(state_->plain->candidates.size());
  state_->takers_seen.resize(state_->plain->candidates.size());
}

ModelProfiler::~ModelProfiler() = default;
ModelProfiler::ModelProfiler(ModelProfiler&&) noexcept = default;
ModelProfiler& ModelProfiler::operator=(ModelProfiler&&) noexcept = default;

int ModelProfiler::chains_measured() const {
  return state_->chains;
}

bool ModelProfiler::complete() const {
  return !state_->trial_region || state_->chains >= state_->options.max_recompute_chain();
}

void ModelProfiler::measure_longer_chains(const std::function<at::Tensor()>& loss_fn) {
  using namespace model_profiling;
  TORCH_CHECK(!complete(), "ckpt::ModelProfiler: every option is measured already (chains of ",
              state_->chains, " measured, ",
              state_->trial_region ? "the longest the options ask for"
                                   : "no \"recomputed\" options asked for",
              "); check complete() first.");
  ProfilingCall call(*state_, loss_fn);
  measure_chains(*state_, call, state_->chains + 1);
}

MeasuredModel ModelProfiler::measured() const {
  using namespace model_profiling;
  const State& s = *state_;
  // Each build marks the cuts in copies of the steps' matchings: the steps stay as measured.
  std::vector<ModeRun> modes = s.modes, with_kept_takers = s.with_kept_takers;
  std::vector<TrialRun> runs = s.runs;
  std::vector<std::pair<const StepRecord*, Matching*>> steps;
  for (auto* runs_of_mode : {&modes, &with_kept_takers}) {
    for (ModeRun& run : *runs_of_mode) steps.emplace_back(run.step.get(), &run.matching);
  }
  for (TrialRun& run : runs) steps.emplace_back(run.step.get(), &run.matching);
  const SplitSegments cuts = split_segments(*s.plain, steps);
  std::vector<ProducersLetGoOption> producers_let_go;
  std::vector<std::vector<bool>> lets_go;
  MeasuredModel result = measured_model(*s.plain, modes, cuts, s.device, producers_let_go, lets_go);
  const std::vector<KeptTakersOption> added =
      add_kept_takers_options(result.profile, *s.plain, with_kept_takers, s.takers);
  const Takers recompute_takers(s.takers_seen);
  if (!runs.empty()) {
    const auto checkpointed = std::find_if(modes.begin(), modes.end(), [](const ModeRun& m) {
      return m.name == kCheckpointedMode && !m.parts;
    });
    add_recomputed_options(result.profile, *s.plain, *checkpointed, runs, s.consumers,
                           recompute_takers);
  }
  exclude_all_but_kept(result.profile, added, s.takers);
  exclude_producers_that_hold(result.profile, producers_let_go, lets_go, recompute_takers.first);
  return result;
}

MeasuredModel profile_model(const std::shared_ptr<torch::nn::Module>& model,
                            const std::function<at::Tensor()>& loss_fn,
                            const ModelProfileOptions& options) {
  ModelProfiler profiler(model, loss_fn, options);
  while (!profiler.complete()) profiler.measure_longer_chains(loss_fn);
  return profiler.measured();
}

}  // namespace ckpt
