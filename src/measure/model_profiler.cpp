#include <ckpt/model_profiler.h>

#include "autograd/rng_state.h"
#include "autograd/saved_tensor_hooks.h"
#include "measure/model_options.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace ckpt {

TensorShape TensorShape::of(const at::Tensor& tensor) {
  if (!tensor.defined()) return {{}, c10::ScalarType::Undefined, c10::Device(c10::DeviceType::CPU)};
  return {tensor.sizes().vec(), tensor.scalar_type(), tensor.device(), tensor.requires_grad()};
}

ProfiledCandidate ProfiledCandidate::of(std::string name, const std::vector<at::Tensor>& inputs) {
  ProfiledCandidate candidate{std::move(name), {}};
  candidate.inputs.reserve(inputs.size());
  for (const auto& t : inputs) candidate.inputs.push_back(TensorShape::of(t));
  return candidate;
}

bool TensorShape::holds(const TensorShape& shape) const {
  if (shape.dtype == c10::ScalarType::Undefined) return dtype == c10::ScalarType::Undefined;
  if (shape.dtype != dtype || shape.device != device) return false;
  if (shape.sizes.size() != sizes.size()) return false;
  if (shape.requires_grad && !requires_grad) return false;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (shape.sizes[d] > sizes[d]) return false;
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

std::string CandidateCalls::name(const std::string& name, const torch::nn::Module* module) {
  const std::string resolved = names_.resolve(name, module);
  if (taken_.insert(resolved).second) return resolved;
  int& later = later_calls_[resolved];
  std::string numbered;
  do {  // past a number a candidate named so took already
    numbered = resolved + "#" + std::to_string(++later + 1);
  } while (!taken_.insert(numbered).second);
  return numbered;
}

}  // namespace detail

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

// What a `ModelProfiler` keeps between its calls: the steps measured so far. (Its parts live in
// namespace model_profiling: a step recorded (measure/model_step.h), matched with the plain step
// (measure/step_matching.h), and the options built from the steps (measure/model_options.h).)
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
  // Where candidates have parts and their "parts checkpointed" steps have not run yet: the region.
  std::optional<CheckpointOptions> parts_region;
  std::vector<TrialRun> runs;
  std::vector<std::set<int>> consumers, takers_seen;
  bool far_takers = false;
  int chains = 0;  // the longest chain measured

  State(std::shared_ptr<torch::nn::Module> model, ModelProfileOptions options, c10::Device device)
      : model(std::move(model)), options(std::move(options)), device(device), names(*this->model) {}
};

namespace model_profiling {
namespace {

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

// By candidate, whether it has parts (markers reached inside it); empty where none has.
std::vector<bool> with_parts(const StepRecord& plain) {
  std::vector<bool> parts(plain.candidates.size());
  for (size_t c = 0; c < parts.size(); ++c) parts[c] = plain.candidates[c].inner_markers > 0;
  if (std::find(parts.begin(), parts.end(), true) == parts.end()) return {};
  return parts;
}

// One step per storage mode (more where it offloads).
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
    // Candidates with parts marked inside them: checkpointed with their parts checkpointed too,
    // measured later (`measure_parts`).
    if (mode.name == kCheckpointedMode && !region->offload() && !with_parts(*s.plain).empty())
      s.parts_region = region;
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

// Inserts `runs` after the last run of the "checkpointed" mode in `into` (at the front where
// none), where the profile lists the "parts checkpointed" options.
void insert_after_checkpointed(std::vector<ModeRun>& into, std::vector<ModeRun> runs) {
  auto at = into.begin();
  for (auto it = into.begin(); it != into.end(); ++it) {
    if (it->name == kCheckpointedMode) at = std::next(it);
  }
  into.insert(at, std::make_move_iterator(runs.begin()), std::make_move_iterator(runs.end()));
}

// Measures the candidates that have parts, checkpointed with their parts checkpointed too. Like a
// recomputed chain, that saves memory for more recompute (the backward holds one part's
// activations at a time, and each part runs once more), so these steps run only where a budget
// needs them. A step that fails leaves the profiler as it was.
void measure_parts(ModelProfiler::State& s, ProfilingCall& call) {
  std::vector<ModeRun> modes, with_kept_takers;
  const ModeRun run{kCheckpointedMode, true, nullptr, {}, with_parts(*s.plain), /*parts=*/true};
  measure_mode(call.setup, *s.plain, call.rng, *s.parts_region, kept_takers(s.takers), run, modes,
               with_kept_takers);
  insert_after_checkpointed(s.modes, std::move(modes));
  insert_after_checkpointed(s.with_kept_takers, std::move(with_kept_takers));
  s.parts_region.reset();
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

}  // namespace
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
  return !state_->parts_region &&
         (!state_->trial_region || state_->chains >= state_->options.max_recompute_chain());
}

void ModelProfiler::measure_more(const std::function<at::Tensor()>& loss_fn) {
  using namespace model_profiling;
  TORCH_CHECK(!complete(), "ckpt::ModelProfiler: every option is measured already (chains of ",
              state_->chains, " measured, ",
              state_->trial_region ? "the longest the options ask for"
                                   : "no \"recomputed\" options asked for",
              "); check complete() first.");
  ProfilingCall call(*state_, loss_fn);
  if (state_->parts_region) {
    measure_parts(*state_, call);
  } else {
    measure_chains(*state_, call, state_->chains + 1);
  }
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
  while (!profiler.complete()) profiler.measure_more(loss_fn);
  return profiler.measured();
}

}  // namespace ckpt
