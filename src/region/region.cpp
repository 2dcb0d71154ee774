#include <ckpt/detail/region.h>

#include "autograd/buffer_guard.h"
#include "autograd/dispatch_mode.h"
#include "autograd/graph.h"
#include "autograd/outside_state.h"
#include "autograd/recompute_scope.h"
#include "checkpoint_node.h"
#include "compat/torch_compat.h"
#include "op_record.h"
#include "recomputed_input.h"
#include "region_state.h"
#include "report_record.h"
#include "selective.h"
#include "two_pass_recompute.h"

#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <optional>
#include <sstream>
#include <utility>

namespace ckpt {
namespace detail {
namespace {

std::string describe(const TensorMeta& meta) {
  if (!meta.defined) return "an undefined tensor";
  std::ostringstream out;
  out << "a tensor of shape [";
  for (size_t i = 0; i < meta.sizes.size(); ++i) out << (i ? ", " : "") << meta.sizes[i];
  out << "], dtype " << c10::toString(meta.dtype) << ", device " << meta.device;
  return out.str();
}

// The arguments a call copies before its function: those its call site saw written into. The
// reentrant variant's forward runs without autograd, so a write into an argument that requires
// grad must raise on every call (wrote_into_inputs_unexpectedly), even at a call site where the
// default variant learned to copy it: such arguments stay uncopied, and their writes seen.
uint64_t inputs_to_copy(const std::vector<at::Tensor>& inputs, uint64_t written,
                        const CheckpointOptions& options) {
  if (!options.use_reentrant()) return written;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].defined() && inputs[i].requires_grad()) written &= ~site_bit(i);
  }
  return written;
}

}  // namespace

TensorMeta TensorMeta::of(const at::Tensor& tensor) {
  TensorMeta meta;
  meta.defined = tensor.defined();
  if (meta.defined) {
    meta.sizes = tensor.sizes().vec();
    meta.dtype = tensor.scalar_type();
    meta.device = tensor.device();
  }
  return meta;
}

bool TensorMeta::operator==(const TensorMeta& other) const {
  return defined == other.defined && sizes == other.sizes && dtype == other.dtype &&
         device == other.device;
}

void RegionState::check_unmodified(bool recomputes) const {
  versions.check("ckpt::checkpoint", [&](size_t i) {
    if (i < inputs.size()) return "tensor argument #" + std::to_string(i) + " of the region";
    return "a parameter of the region (" + describe_shape(versions.tensor(i)) + ")";
  });
  if (recomputes) outside_reads.check("ckpt::checkpoint");
}

void RegionState::check_recomputed(const std::vector<at::Tensor>& recomputed) const {
  TORCH_CHECK(recomputed.size() == outputs.size(),
              "ckpt::checkpoint: the recomputation of the region returned ", recomputed.size(),
              " tensors, but the forward pass returned ", outputs.size(),
              ". The checkpointed function must compute the same thing when it runs again.");
  if (!options.determinism_check()) return;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const TensorMeta now = TensorMeta::of(recomputed[i]);
    TORCH_CHECK(now == outputs[i], "ckpt::checkpoint: the recomputation of the region produced ",
                describe(now), " as output #", i, ", but the forward pass produced ",
                describe(outputs[i]),
                ". The checkpointed function must compute the same thing when it runs again: a "
                "branch on a global, a counter or a tensor's value changed since the forward "
                "computes something else. CheckpointOptions().debug(true) shows the operators "
                "of both runs and check_values(true) names the first that computes other values; "
                "determinism_check(false) skips this check.");
  }
}

void RegionState::check_same_values(const std::vector<at::Tensor>& recomputed,
                                    const std::string& parted) const {
  const std::vector<uint64_t> sums = output_checksums(recomputed);
  for (size_t i = 0; i < sums.size() && i < forward_output_sums.size(); ++i) {
    TORCH_CHECK(sums[i] == forward_output_sums[i],
                "ckpt::checkpoint (check_values): the recompute of the region computed other "
                "values than its forward for output #",
                i,
                ", and its operators parted from the "
                "forward's: ",
                parted,
                " (the reentrant variant's forward runs without grad, where a composite operator "
                "may run others, so only its outputs are compared past that point). Its gradients "
                "would not be those of the forward: the function must compute the same thing "
                "when it runs again.");
  }
}

void RegionState::check_same_graph(const GraphShape& forward, const GraphShape& recomputed) const {
  if (!options.determinism_check() || forward == recomputed) return;
  if (forward.scripted || recomputed.scripted) return;  // a TorchScript executor specialised
  TORCH_CHECK(false,
              "ckpt::checkpoint: the recomputation of the region built a different autograd "
              "graph (",
              recomputed.nodes, " operations) than the forward pass (", forward.nodes,
              " operations), so its gradients would not be those of the forward. A module switched "
              "between train() and eval() after the forward pass does this (a validation pass "
              "before the backward, say): ckpt recomputes in the forward's mode the modules it "
              "sees (the checkpointed module, module arguments, Checkpointed, "
              "checkpoint_sequential, PlannedSequential), but not those a lambda captures; pass "
              "them as arguments. Otherwise the checkpointed function must compute the same thing "
              "when it runs again: CheckpointOptions().debug(true) shows the operators of both "
              "runs where they part; determinism_check(false) skips this check.");
}

std::vector<at::Tensor> RegionState::run_recompute(const std::vector<at::Tensor>* replacement,
                                                   DispatchMode* early_stop,
                                                   const SavedHooksFactory& saving) const {
  std::vector<at::Tensor> held;  // the arguments, where no replacement is given
  if (replacement == nullptr) {
    held = arguments(/*with_history=*/true);
    replacement = &held;
  }
  const RecomputeScope scope(rng, autocast, training, modules, &buffers_at_forward);
  std::optional<SavedTensorHooksScope> saved_hooks;
  if (saving) saved_hooks.emplace(saving);
  const LearnedAsAt sites_as_at_forward(learned_moment);  // regions inside are made as then
  const RegionContext context = recompute_context ? recompute_context() : nullptr;
  const LabelScope label(child_label(memory_label, "recompute"));
  const at::AutoGradMode grad_mode(true);
  std::optional<DispatchModeGuard> early_stop_guard;
  if (early_stop != nullptr) early_stop_guard.emplace(*early_stop);
  // What the forward wrote outside the region's sight and read again (a module a lambda captures
  // that updates a buffer and then reads it) is as the forward found it while the recompute runs;
  // what the recompute writes there goes back afterwards. The watch's mode goes in last: it sees
  // every call first.
  const OutsideState::Swap outside_as_at_forward(outside_at_forward);
  OutsideStateWatch outside(*replacement, modules);
  if (!kept && !options.debug() && !options.check_values()) {
    const DispatchModeGuard outside_guard(outside);
    std::vector<at::Tensor> recomputed = recompute(replacement);
    check_random_draws(scope, outside);
    return recomputed;
  }
  std::optional<ReplayMode> replay;
  std::vector<std::string> recompute_ops;
  RecordingMode recording(recompute_ops);
  std::optional<ValueCheckingMode> checking;
  std::vector<at::Tensor> recomputed;
  {
    std::optional<DispatchModeGuard> replay_guard, recording_guard, checking_guard;
    if (kept) {
      const bool consume = !torch::autograd::get_current_graph_task_keep_graph();
      replay_guard.emplace(replay.emplace(options.policy(), *kept, consume));
    }
    if (options.debug()) recording_guard.emplace(recording);
    // Outside the replay: a kept output is checked as the replay hands it out.
    if (options.check_values()) {
      checking_guard.emplace(
          checking.emplace(forward_values, ValueSample(options.check_values_ops()),
                           replay ? &*replay : nullptr, options.use_reentrant()));
    }
    const DispatchModeGuard outside_guard(outside);
    recomputed = recompute(replacement);
  }
  check_random_draws(scope, outside);
  if (checking && checking->diverged()) check_same_values(recomputed, checking->parted());
  if (options.debug()) check_same_operators(forward_ops, recompute_ops);
  if (replay) replay->check_all_used();
  return recomputed;
}

std::vector<at::Tensor> RegionState::arguments(bool with_history) const {
  TORCH_CHECK(!arguments_let_go,
              "ckpt::checkpoint: the region's arguments were let go of in its last backward, and "
              "something asked for them again afterwards; please report this with the model.");
  const RecomputedValues shared;  // a region several dropped arguments come from runs once
  std::vector<at::Tensor> result;
  result.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (i < dropped.size() && dropped[i].source) {
      result.push_back(with_history ? dropped[i].materialize() : dropped[i].source->value());
    } else if (input_copies.copied(i)) {
      result.push_back(input_copies.fresh(i, with_history));
    } else {
      result.push_back(inputs[i]);
    }
  }
  return result;
}

std::vector<at::Tensor> RegionState::recompute_values() const {
  TORCH_CHECK(!released && recompute,
              "ckpt::checkpoint: a region's argument was to be computed again from the region "
              "that returned it, but that region's backward already ran and freed what it "
              "needs. Run the backward through both regions in one call, or keep the argument "
              "(don't ask its region to drop it).");
  check_unmodified();
  const std::vector<at::Tensor> args = arguments(/*with_history=*/false);
  const RecomputeScope scope(rng, autocast, training, modules, &buffers_at_forward);
  const LearnedAsAt sites_as_at_forward(learned_moment);
  const LabelScope label(child_label(memory_label, "recompute"));
  const OutsideState::Swap outside_as_at_forward(outside_at_forward);
  OutsideStateWatch outside(args, modules);
  const DispatchModeGuard outside_guard(outside);
  const at::NoGradGuard no_grad;
  std::vector<at::Tensor> recomputed = recompute(&args);
  check_random_draws(scope, outside);
  return recomputed;
}

void RegionState::check_random_draws(const RecomputeScope& scope,
                                     const OutsideStateWatch& recompute) const {
  if (options.determinism_check()) {
    scope.check_random_draws(forward_draws, recompute.random_draws(), "ckpt::checkpoint",
                             " determinism_check(false) skips this check.");
  }
}

void RegionState::hand_out(const std::vector<at::Tensor>& outputs) {
  served.assign(connected.size(), false);
  handed_out.reserve(connected.size());
  for (size_t slot : connected) {
    handed_out.emplace_back(outputs[slot].getIntrusivePtr());
  }
}

void RegionState::begin_backward(const std::vector<at::Tensor>& grads) {
  bool again = released;
  serving.clear();
  for (size_t slot = 0; slot < grads.size() && !again; ++slot) {
    if (!grads[slot].defined()) continue;
    again = served[slot];
    serving.push_back(slot);
  }
  TORCH_CHECK(!again,
              "ckpt::checkpoint: Trying to backward through a checkpointed region a second time "
              "(or after its saved inputs were freed). Specify retain_graph=true on the first "
              "backward if you need to backward through the graph again.");
  in_engine_call = true;
}

void RegionState::end_backward() {
  if (!in_engine_call) return release();
  in_engine_call = false;
  for (size_t slot : serving) served[slot] = true;
  serving.clear();
  for (size_t slot = 0; slot < served.size(); ++slot) {
    if (!served[slot] && !handed_out[slot].expired()) return;
  }
  release();
}

bool RegionState::backward_is_last(bool in_group) const {
  if (in_group || at::GradMode::is_enabled() ||
      torch::autograd::get_current_graph_task_keep_graph()) {
    return false;
  }
  for (size_t slot = 0; slot < served.size(); ++slot) {
    const bool now = std::find(serving.begin(), serving.end(), slot) != serving.end();
    if (!served[slot] && !now && !handed_out[slot].expired()) return false;
  }
  return true;
}

void RegionState::let_go_of_arguments() {
  for (size_t i = 0; i < inputs.size(); ++i) {
    inputs[i] = at::Tensor();
    versions.let_go(i);  // still checked: a version counter holds no data
  }
  input_copies.clear();
  dropped.clear();
  arguments_let_go = true;
}

void RegionState::release() {
  released = true;
  recompute = nullptr;
  inputs.clear();
  input_copies.clear();
  dropped.clear();
  modules.clear();
  training = TrainingModes();
  buffers_at_forward = BuffersAtForward();
  outside_at_forward = OutsideState();
  versions.clear();
  outside_reads.clear();
  rng.reset();
  kept.reset();
  forward_ops.clear();
  forward_output_sums.clear();
  handed_out.clear();
}

Region::Region(const CheckpointOptions& options, std::vector<at::Tensor> inputs, ModuleList modules,
               std::shared_ptr<CallSite> site)
    : state_(std::make_shared<RegionState>()),
      site_(std::move(site)),
      request_(take_region_request()) {
  RegionState& state = *state_;
  // First, so that a factory that throws leaves nothing to undo.
  if (options.context_fn()) {
    RegionContexts contexts = options.context_fn()();
    forward_context_ = std::move(contexts.forward);
    state.recompute_context = std::move(contexts.recompute);
  }
  state.memory_label = next_region_label();
  state.site = site_;
  if (!options.use_reentrant()) state.forward_group = current_graph_exec_group();
  const LabelScope label(state.memory_label);  // what the region stashes is its own
  state.options = options;
  if (const std::optional<bool> debug = checkpoint_debug_enabled()) state.options.debug(*debug);
  if (const std::optional<bool> check = checkpoint_check_values())
    state.options.check_values(*check);
  state.learned_moment = learning_moment();
  state.input_copies = InputCopies(
      inputs, inputs_to_copy(inputs, site_->written_inputs_at(state.learned_moment), options));
  for (size_t i = 0; i < inputs.size(); ++i) {
    TORCH_CHECK(!inputs[i].defined() || !inputs[i].is_inference(),
                "ckpt::checkpoint: tensor argument #", i,
                " is an inference tensor (created under c10::InferenceMode), which autograd "
                "cannot save for the backward pass. Create it outside InferenceMode, or pass a "
                "clone made outside it.");
    // A copied argument is not read again: the recompute starts from its copy.
    state.versions.add(state.input_copies.copied(i) ? at::Tensor() : inputs[i]);
  }
  // The non-reentrant variant finds the parameters at its border in the graph (finish); the
  // reentrant one records no graph to find them in.
  if (options.use_reentrant()) {
    for (const auto& module : modules) {
      for (const auto& parameter : module->parameters()) state.versions.add(parameter);
    }
  }
  state.training = TrainingModes(modules);
  state.buffers_at_forward = BuffersAtForward(modules, site_->written_buffers.load());
  state.modules = std::move(modules);
  if (options.policy()) {
    TORCH_CHECK(!options.use_reentrant(),
                "ckpt::checkpoint: a selective checkpointing policy needs the non-reentrant "
                "variant: the reentrant one runs its forward without autograd, so there is no "
                "graph to hand kept outputs to. Drop use_reentrant(true), or the policy.");
    state.kept = std::make_unique<KeptOutputs>();
  }
  const c10::DeviceType device_type = infer_device_type(inputs);
  if (options.preserve_rng_state()) state.rng.emplace(inputs, device_type);
  state.autocast = AutocastState::current(device_type);
  state.cast_cache_off.emplace();
  state.inputs = std::move(inputs);
  marker_ = std::make_unique<RegionMarker>();
  if (KeptReport* report = active_report()) {
    const char* mode = options.policy()          ? "selective"
                       : options.use_reentrant() ? "checkpointed (reentrant)"
                                                 : "checkpointed";
    report_ = std::make_unique<RegionRecord>(*report, MemoryLabel::current(), mode);
  }
}

Region::~Region() {
  state_->cast_cache_off.reset();  // the forward is over
}

Region::ForwardScope::ForwardScope(Region& region)
    : region_(region),
      context_(region.forward_context_ ? region.forward_context_() : nullptr),
      label_(region.state_->memory_label),
      grad_mode_(!region.state_->options.use_reentrant()) {
  if (saved_tensor_hooks_active()) {  // nothing to turn off otherwise: no allocation per region
    hooks_off_ = std::make_unique<SavedTensorHooksScope>(SavedHooksFactory());
  }
  RegionState& state = *region.state_;
  // The forward lets go of its graph's saved tensors as it goes, as PyTorch's pack hooks drop
  // them, where a second run can start from the same random state (without a stash, and where an
  // argument the function writes into leads from outside into the graph, it keeps the graph).
  const bool release_graph = !state.options.use_reentrant() && state.rng.has_value() &&
                             state.input_copies.empty() && !state.keeps_forward_graph &&
                             !region.site_->keeps_forward_graph_at(state.learned_moment);
  if (release_graph) {
    buffers_ = std::make_unique<BufferGuard>(state.modules, BufferGuard::Copy::BeforeFirstWrite);
    release_ = std::make_unique<GraphRelease>(state.inputs);
  }
  if (state.kept) {
    caching_ = std::make_unique<CachingMode>(state.options.policy(), *state.kept,
                                             state.rng ? &*state.rng : nullptr);
    caching_guard_ = std::make_unique<DispatchModeGuard>(*caching_);
  }
  if (region.report_) {
    report_ = std::make_unique<ReportMode>(state.kept.get(), region.report_->start_forward());
    report_guard_ = std::make_unique<DispatchModeGuard>(*report_);
  }
  if (state.options.debug()) {
    recording_ = std::make_unique<RecordingMode>(state.forward_ops);
    recording_guard_ = std::make_unique<DispatchModeGuard>(*recording_);
  }
  if (state.options.check_values()) {
    values_ = std::make_unique<ValueRecordingMode>(
        state.forward_values, ValueSample(state.options.check_values_ops()), state.kept.get());
    values_guard_ = std::make_unique<DispatchModeGuard>(*values_);
  }
  OutsideStateWatch::BeforeCall before_call;
  if (release_) {
    before_call = [release = release_.get()](const c10::OperatorHandle& op,
                                             const torch::jit::Stack& stack) {
      release->release_producers(op, stack);
    };
  }
  // Writes into buffers: seen by the dispatcher, where a version counter may miss them, and
  // copied just before the first, for a second run.
  const auto before_buffer_write = [&at_forward = state.buffers_at_forward,
                                    copies = buffers_.get()](const c10::StorageImpl* storage) {
    at_forward.note_write(storage);
    if (copies != nullptr) copies->copy_before_write(storage);
  };
  outside_ = std::make_unique<OutsideStateWatch>(state.inputs, state.modules,
                                                 OutsideStateWatch::Purpose::Keep,
                                                 std::move(before_call), before_buffer_write);
  outside_guard_ = std::make_unique<DispatchModeGuard>(*outside_);
}

Region::ForwardScope::~ForwardScope() = default;

void Region::ForwardScope::finished() {
  region_.state_->forward_graph_whole = release_ == nullptr || !release_->released_any();
  if (buffers_) buffers_->dismiss();
  region_.state_->outside_at_forward = outside_->finished();
  region_.state_->outside_reads = outside_->take_reads();
  region_.state_->forward_draws = outside_->random_draws();
}

bool Region::ForwardScope::failed_on_released_graph(const ReleasedGraphError& error) const {
  return release_ != nullptr && error.forward_id() == release_->id();
}

std::optional<KeepGraphReason> Region::ForwardScope::released_graph_needed(
    const std::vector<at::Tensor>& outputs) {
  if (release_ == nullptr || !release_->released_any()) return std::nullopt;
  // `Region::finish` keeps this call's graph where a buffer was written that no copy can put back,
  // or where the forward drew beside another thread's replay.
  RegionState& state = *region_.state_;
  if (state.buffers_at_forward.lost_so_far()) return KeepGraphReason::WroteBuffer;
  // A forward that drew nothing (most) drew nothing beside a replay: its generators go unread.
  const RandomDraws draws = outside_->random_draws();
  if (!draws.devices.empty()) {
    state.rng->note_forward_end(draws);
    state.rng_forward_end_noted = true;  // `finish` reads the generators no more
    if (state.rng->forward_beside_replay(draws)) return KeepGraphReason::DrewBesideReplay;
  }
  if (release_->held_outside(outputs)) return KeepGraphReason::StoredOutside;
  return std::nullopt;
}

namespace {
const char* released_graph_message(KeepGraphReason reason) {
  if (reason == KeepGraphReason::WroteArgument) {
    return "ckpt::checkpoint: the function writes into its argument after its forward let go of "
           "saved tensors; the region runs it again keeping its graph.";
  }
  return "ckpt::checkpoint: Trying to backward through the graph of a checkpointed region's "
         "forward, whose saved tensors the forward released as it went (as PyTorch's "
         "checkpointing drops them). A backward through the region's intermediates works "
         "inside its function (the region then keeps its graph); outside it, backward through "
         "the region's outputs instead.";
}
}  // namespace

ReleasedGraphError::ReleasedGraphError(uint64_t forward_id, KeepGraphReason reason)
    : c10::Error({__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                 released_graph_message(reason)),
      forward_id_(forward_id),
      reason_(reason) {}

void Region::prepare_second_forward(KeepGraphReason reason) {
  RegionState& state = *state_;
  // This region keeps its graph now, whatever moment its call site answers for (a recompute
  // around it makes it as its site stood before it learned this, and it learns it again).
  state.keeps_forward_graph = true;
  if (state.kept) state.kept->entries.clear();
  state.forward_ops.clear();
  state.forward_values.clear();
  state.rng->restore();
  state.rng_forward_end_noted = false;
  // This call keeps its graph (`finish` says why; a call site learns to copy what was written),
  // and later calls let go of theirs again.
  if (reason == KeepGraphReason::WroteArgument || reason == KeepGraphReason::WroteBuffer ||
      reason == KeepGraphReason::DrewBesideReplay) {
    return;
  }
  if (!site_->learn_keeps_forward_graph()) return;
  if (reason == KeepGraphReason::StoredOutside) {
    TORCH_WARN(
        "ckpt::checkpoint: the function stored an intermediate tensor outside its region (not "
        "among its results), whose graph the region's forward lets go of as it goes. The region "
        "ran the function again keeping that graph, and will keep it at this call site from now "
        "on. Return the tensor from the function instead to keep the forward's memory low.");
    return;
  }
  TORCH_WARN(
      "ckpt::checkpoint: the function ran a backward through its own intermediates inside a "
      "checkpointed region, whose forward lets go of their saved tensors as it goes. The region "
      "ran the function again keeping them, and will keep them at this call site from now on.");
}

// The function wrote into a tensor argument that was not copied, so the recompute cannot start
// from the value the forward started from. The call site copies it from now on.
bool Region::wrote_into_inputs_unexpectedly() {
  RegionState& state = *state_;
  uint64_t written = 0;
  std::string arguments;
  for (size_t i = 0; i < state.inputs.size(); ++i) {
    if (!state.versions.changed(i)) continue;
    written |= site_bit(i);
    arguments += (arguments.empty() ? "#" : ", #") + std::to_string(i);
  }
  if (written == 0) return false;
  const std::string what =
      "ckpt::checkpoint: the checkpointed function wrote into its tensor argument " + arguments +
      " in place during its forward pass (an in-place ReLU on its input, say), so a recompute "
      "could not start from the values the forward started from. ";
  if (state.options.use_reentrant()) {
    // Its forward runs without autograd: the write is invisible to the argument's other uses
    // (a residual connection reads the written values but differentiates the unwritten ones).
    bool requires_grad = false;
    for (size_t i = 0; i < state.inputs.size(); ++i) {
      requires_grad |= state.versions.changed(i) && state.inputs[i].requires_grad();
    }
    if (state.rng.has_value()) state.rng->restore();
    TORCH_CHECK(!requires_grad, what,
                "With use_reentrant(true) the forward runs without autograd, so autograd would "
                "not see the write where the argument is used after the region, and gradients "
                "would be wrong. Use the default variant, which supports it, or make the "
                "function's first operation on it out of place (relu instead of relu_).");
  }
  // Learned already where a recompute makes the region again as its forward did: said then.
  const bool news = site_->learn_written_inputs(written);
  const bool keeps_graph = !state.options.use_reentrant() && state.forward_graph_whole;
  const std::string advice =
      "From now on this call site copies that argument before the function (one copy per call, "
      "kept until the backward instead of the argument), so later calls are checkpointed. To "
      "avoid the copy, make the function's first operation on it out of place (relu instead of "
      "relu_), or apply the in-place operation before the region.";
  if (keeps_graph) {
    if (news) {
      TORCH_WARN(what, "This call keeps its activations instead of checkpointing them. ", advice);
    }
    return true;
  }
  if (state.rng.has_value()) state.rng->restore();
  TORCH_CHECK(false, what, "This call could not be checkpointed (",
              state.options.use_reentrant() ? "use_reentrant(true) records no graph"
                                            : "its forward let go of its graph",
              ") and failed; run it again. ", advice);
}

// The function wrote into a buffer of its modules that this call did not copy (one no forward at
// this call site had written before), so a recompute would start from the value the forward left.
// The call site copies it from now on. The first call in training teaches which buffers the
// function writes, none included (a buffer it only reads, a causal mask, is then copied no more);
// a call with a module in eval mode teaches nothing: in training the same function writes more
// (BatchNorm's statistics and step count).
bool Region::wrote_into_buffers_unexpectedly() {
  RegionState& state = *state_;
  const uint64_t written = state.buffers_at_forward.finish();
  if (state.training.all_training() || site_->buffers_learned.load()) {
    if (site_->buffers_learned.exchange(true)) {
      site_->written_buffers.fetch_or(written);
    } else {
      site_->written_buffers.store(written);
    }
  }
  if (!state.buffers_at_forward.lost()) return false;
  const std::string what =
      "ckpt::checkpoint: the checkpointed function wrote into a buffer of its modules during its "
      "forward pass that no earlier call here wrote into, so a recompute would start from the "
      "value the forward left instead of the one it started from (a module that updates a "
      "buffer and then reads it would compute other values). From now on this call site copies "
      "that buffer before the function. ";
  if (!state.options.use_reentrant() && state.forward_graph_whole) {
    TORCH_WARN(what, "This call keeps its activations instead of checkpointing them.");
    return true;
  }
  if (state.rng.has_value()) state.rng->restore();
  TORCH_CHECK(false, what, "This call could not be checkpointed (",
              state.options.use_reentrant() ? "use_reentrant(true) records no graph"
                                            : "its forward let go of its graph",
              ") and failed; run it again.");
}

// Another thread wrote a state into a generator (to recompute a region of its own) while this
// forward drew from it: the draws may have come from that state, which no recompute can repeat.
bool Region::drew_beside_a_replay() {
  RegionState& state = *state_;
  if (!state.rng.has_value()) return false;
  if (!state.rng_forward_end_noted) state.rng->note_forward_end(state.forward_draws);
  if (!state.rng->forward_beside_replay(state.forward_draws)) return false;
  const std::string what =
      "ckpt::checkpoint: another thread wrote a random state into a generator (to recompute a "
      "region of its own) while this region's forward drew random numbers from it, so a "
      "recompute could not repeat those draws. ";
  TORCH_CHECK(!state.options.use_reentrant() && state.forward_graph_whole, what,
              "This call could not be checkpointed (",
              state.options.use_reentrant() ? "use_reentrant(true) records no graph"
                                            : "its forward let go of its graph",
              ") and failed. Run steps that draw random numbers inside checkpointed regions one "
              "thread at a time.");
  TORCH_WARN_ONCE(what,
                  "Such a call keeps its activations instead of checkpointing them. Run steps "
                  "that draw random numbers inside checkpointed regions one thread at a time to "
                  "checkpoint them all. (Said once.)");
  return true;
}

std::vector<at::Tensor> Region::finish(std::vector<at::Tensor> outputs, RecomputeFn recompute) {
  RegionState& state = *state_;
  if (wrote_into_inputs_unexpectedly() || wrote_into_buffers_unexpectedly() ||
      drew_beside_a_replay()) {
    if (report_) report_->keeps_graph();  // this call keeps its graph
    return outputs;
  }
  if (state.rng.has_value() && !state.rng->had_device_at_forward()) {
    TORCH_CHECK(!compat::device_initialized(state.rng->device_type()), "ckpt::checkpoint: the ",
                c10::DeviceTypeName(state.rng->device_type()),
                " device state was initialized in the forward pass of a checkpointed region, so "
                "its RNG state could not be preserved. Initialize the device before the region "
                "(for example by creating a tensor on it), or pass "
                "CheckpointOptions().preserve_rng_state(false).");
  }
  if (state.kept) {
    state.kept->seal();
    state.kept->offload();
  }
  state.outputs.reserve(outputs.size());
  for (const auto& output : outputs) state.outputs.push_back(TensorMeta::of(output));
  if (state.options.check_values()) state.forward_output_sums = output_checksums(outputs);
  state.recompute = std::move(recompute);
  outputs = state.options.use_reentrant() ? finish_reentrant(std::move(outputs))
                                          : finish_non_reentrant(std::move(outputs));
  if (request_ != nullptr && !state.options.use_reentrant() && !state.kept) apply_request();
  // Each pass would compute a dropped argument again: such regions recompute once.
  if (state.options.two_pass_recompute() && !state.options.use_reentrant() && !state.kept &&
      !state.options.offload() && state.dropped.empty() && !state.connected.empty()) {
    state.recompute_twice = prepare_two_pass_recompute();
  }
  // Its state lives on until the backward only where outputs were handed to its node.
  if (report_) report_->finish(state, !state.handed_out.empty());
  return outputs;
}

// A planner's request: drop the arguments it has sources for, hand out sources for the outputs.
// Only where the region's state lives until its backward (some output was connected).
void Region::apply_request() {
  RegionState& state = *state_;
  if (state.connected.empty()) return;
  const auto& sources = request_->input_sources;
  for (size_t i = 0; i < sources.size() && i < state.inputs.size(); ++i) {
    at::Tensor& input = state.inputs[i];
    if (!sources[i] || !input.defined() || state.input_copies.copied(i)) continue;
    state.dropped.resize(state.inputs.size());
    state.dropped[i] = {sources[i], input.requires_grad()
                                        ? torch::autograd::impl::gradient_edge(input)
                                        : torch::autograd::Edge()};
    input = at::Tensor();
    state.versions.let_go(i);  // a write into it after the forward still raises
  }
  if (!request_->recomputable_outputs) return;
  request_->output_sources.assign(state.outputs.size(), nullptr);
  for (size_t slot : state.connected) {
    request_->output_sources[slot] = std::make_shared<const RecomputeSource>(state_, slot);
  }
}

std::vector<at::Tensor> Region::finish_non_reentrant(std::vector<at::Tensor> outputs) {
  RegionState& state = *state_;
  edge_list roots;
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (outputs[i].defined() && outputs[i].requires_grad()) {
      state.connected.push_back(i);
      roots.push_back(torch::autograd::impl::gradient_edge(outputs[i]));
    }
  }
  if (state.connected.empty()) return outputs;  // nothing to differentiate, nothing kept

  Boundary boundary = find_boundary(roots, *marker_);
  for (const Edge& edge : boundary.edges) {
    const at::Tensor leaf = leaf_variable(edge);
    if (leaf.defined()) state.versions.add(leaf);
  }
  auto node = compat::make_node<NonReentrantBackward>(state_, std::move(boundary));
  for (size_t slot = 0; slot < state.connected.size(); ++slot) {
    at::Tensor& output = outputs[state.connected[slot]];
    at::Tensor alias = fresh_alias(output);
    // A write into the returned tensor must reach the version counter of the one the region
    // computed: where that is a kept output (or a view of one), the recompute then sees it.
    if (state.kept) {
      alias.unsafeGetTensorImpl()->set_version_counter(
          output.unsafeGetTensorImpl()->version_counter());
    }
    output = std::move(alias);
    torch::autograd::impl::set_gradient_edge(
        output, torch::autograd::Edge(node, node->add_input_metadata(output)));
  }
  state.hand_out(outputs);
  return outputs;
}

std::vector<at::Tensor> Region::finish_reentrant(std::vector<at::Tensor> outputs) {
  RegionState& state = *state_;
  edge_list input_edges;
  bool any_input_requires_grad = false;
  for (const auto& input : state.inputs) {
    const bool requires_grad = input.defined() && input.requires_grad();
    any_input_requires_grad |= requires_grad;
    input_edges.push_back(requires_grad ? torch::autograd::impl::gradient_edge(input)
                                        : torch::autograd::Edge());
  }
  if (!any_input_requires_grad) {
    if (site_->warned.exchange(true)) return outputs;
    TORCH_WARN(
        "ckpt::checkpoint: None of the inputs have requires_grad=True. Gradients will be None "
        "(with use_reentrant(true), gradients flow only through tensor arguments; use "
        "use_reentrant(false) to get gradients for captured parameters).");
    return outputs;
  }
  auto node = compat::make_node<ReentrantBackward>(state_, std::move(input_edges));
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (!outputs[i].defined() || !is_differentiable(outputs[i])) continue;
    at::Tensor& output = outputs[i];
    output = fresh_alias(output);
    torch::autograd::impl::set_gradient_edge(
        output, torch::autograd::Edge(node, node->add_input_metadata(output)));
    state.connected.push_back(i);
  }
  state.hand_out(outputs);
  return outputs;
}

}  // namespace detail
}  // namespace ckpt
