#include <ckpt/memory_tracker.h>
#include <ckpt/offload.h>
#include <ckpt/profiler.h>

#include "autograd/buffer_guard.h"
#include "autograd/forward_record.h"
#include "autograd/graph.h"
#include "autograd/host_offload.h"
#include "autograd/outside_state.h"
#include "autograd/rng_state.h"
#include "autograd/stage_graph.h"
#include "compat/torch_compat.h"
#include "measure/meta_memory.h"
#include "measure/step_measure.h"

#include <ckpt/plan/simulator.h>
#include <ckpt/plan/solvers.h>

#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <unordered_set>

namespace ckpt {
namespace {

using detail::allocated_storage_bytes;
using detail::Clock;
using detail::median;
using detail::seconds_since;
using detail::SwappedGradients;

// The bytes of the parameter gradients each stage's backward creates (Stage::gradient_bytes), as
// the device allocates them (on an accelerator a LayerNorm's 64-byte bias takes 512): a parameter
// shared by several stages counts in the last, whose backward runs first.
std::vector<int64_t> gradient_bytes_per_stage(const std::vector<torch::nn::AnyModule>& stages) {
  std::vector<int64_t> bytes(stages.size(), 0);
  std::unordered_set<const c10::TensorImpl*> seen;
  for (size_t i = stages.size(); i-- > 0;) {
    for (const auto& p : stages[i].ptr()->parameters()) {
      if (!p.requires_grad() || !seen.insert(p.unsafeGetTensorImpl()).second) continue;
      bytes[i] += detail::allocated_bytes_of(p);
    }
  }
  return bytes;
}

using Leaves = std::unordered_set<const c10::TensorImpl*>;

// Runs the stage's forward in one storage mode (`forward`: plainly, or as a checkpointed region)
// with grad enabled, and its backward, repeatedly: median times, what the forward keeps, and the
// temporaries of both, as one storage option of the planner. The forward's temporaries are above
// what it keeps; the backward's are above its inputs and the input gradient it produces. The
// backward is the executor's own (its leaves' gradients collected as the chain's are, with
// `single_stage_leaves` its stages' sole leaves): measured through another path, a recomputing
// stage's backward came out up to its output's size below what the executor holds.
plan::StorageOption measure_full_storage(torch::nn::AnyModule& stage,
                                         const detail::StageForward& forward, const at::Tensor& x,
                                         bool input_grad, const Leaves& single_stage_leaves,
                                         const ProfileOptions& options, MemoryTracker& tracker) {
  const c10::Device device = x.device();
  std::vector<double> forward_times, backward_times;
  int64_t saved = 0, forward_tmp = 0, backward_tmp = 0, offloaded = 0;
  // Held as the executor's chain node holds them (an edge to each leaf's accumulator), so that
  // a sole gradient goes into an existing .grad at once here too.
  std::vector<decltype(torch::autograd::impl::grad_accumulator(at::Tensor()))> accumulators;
  for (const auto& parameter : stage.ptr()->parameters()) {
    if (parameter.requires_grad())
      accumulators.push_back(torch::autograd::impl::grad_accumulator(parameter));
  }
  for (int r = 0; r < options.warmup() + options.repeats(); ++r) {
    tracker.reset_peak();
    const int64_t before = tracker.current_bytes();
    const int64_t host_before = offload_stats().host_bytes;
    detail::HostHighWater host_high;  // what the forward holds at most
    auto start = detail::clock_now(device);
    detail::StageGraph graph(forward, x, input_grad);
    const double forward_time = seconds_since(start, device);
    offloaded = std::max(offloaded, host_high.restart() - host_before);
    saved = std::max<int64_t>(tracker.current_bytes() - before,
                              allocated_storage_bytes(graph.output()));
    forward_tmp = std::max(forward_tmp, tracker.peak_bytes() - before - saved);

    at::Tensor grad_output = at::ones_like(graph.output());
    // The parameters' gradients as a step's backward meets them: made by the backward where the
    // step starts without them, so that the backward's temporaries include those it makes before
    // its peak (most of them, in a stage that holds a whole sub-network); buffers made only now
    // where they exist before the step (made before the forward, they would lift its peak).
    const SwappedGradients gradients({stage.ptr()}, options.count_parameter_gradients()
                                                        ? SwappedGradients::Start::None
                                                        : SwappedGradients::Start::ZeroBuffers);
    tracker.reset_peak();
    const int64_t before_backward = tracker.current_bytes();
    start = detail::clock_now(device);
    detail::LeafGradients leaves(single_stage_leaves);
    at::Tensor input_grad_value = graph.backward(std::move(grad_output), leaves);
    const double backward_time = seconds_since(start, device);
    backward_tmp = std::max(backward_tmp, tracker.peak_bytes() - before_backward -
                                              allocated_storage_bytes(input_grad_value));
    leaves.accumulate_rest();  // where the chain's backward ends
    if (r >= options.warmup()) {
      forward_times.push_back(forward_time);
      backward_times.push_back(backward_time);
    }
  }
  plan::StorageOption option;
  option.forward_time = median(forward_times);
  option.backward_time = median(backward_times);
  option.saved_bytes = saved;
  option.forward_tmp_bytes = std::max<int64_t>(forward_tmp, 0);
  option.backward_tmp_bytes = std::max<int64_t>(backward_tmp, 0);
  option.offloaded_bytes = offloaded;
  return option;
}

struct NoGradForward {
  at::Tensor output;
  int64_t tmp_bytes = 0;          // above the output
  double time = 0.0;              // median
  bool draws_random = false;      // on the CPU: its random state moved
  int64_t buffer_bytes = 0;       // one copy of every buffer of the stage
  int64_t kept_buffer_bytes = 0;  // the copies of those it wrote into or shares
};

// The copies of a stage's buffers that the executor makes around the first forward of a stage it
// runs again (all of them, then those the forward wrote into and those `shared` marks), as the
// tracker counts them: none for buffers off the tracked device.
class BufferCopies {
 public:
  BufferCopies(torch::nn::AnyModule& stage, uint64_t shared, MemoryTracker& tracker)
      : tracker_(tracker) {
    const int64_t before = tracker.current_bytes();
    copies_ = detail::BuffersAtForward({stage.ptr()}, ~uint64_t{0}, shared);
    all_bytes_ = tracker.current_bytes() - before;
  }
  int64_t all_bytes() const { return all_bytes_; }
  /// After the forward: lets go of the copies of the buffers it did not write into (and no other
  /// stage shares); returns the bytes of those kept.
  int64_t kept_bytes() {
    const int64_t before = tracker_.current_bytes();
    copies_.finish();
    return all_bytes_ - (before - tracker_.current_bytes());
  }

 private:
  MemoryTracker& tracker_;
  detail::BuffersAtForward copies_;
  int64_t all_bytes_ = 0;
};

// Whether an unmeasured no-grad forward of the stage moves the CPU generator's state. It runs on
// a copy of the input: a stage that writes into its input (an in-place dropout) would otherwise
// change the output measured before it, which the next stage takes.
bool moves_cpu_generator(torch::nn::AnyModule& stage, const at::Tensor& x) {
  detail::RngStash stash({x}, detail::infer_device_type({x}));
  stage.forward<at::Tensor>(x.clone());
  stash.note_forward_end();
  return stash.cpu_state().defined();
}

// The forward of forward_none and forward_input, repeatedly: its temporaries and its own time,
// which is below the grad-enabled forward's (no autograd graph is built), whether it draws
// random numbers on the CPU (the executor's stash of a stage that runs again is then kept), and
// the executor's copies of its buffers.
NoGradForward measure_no_grad_forward(torch::nn::AnyModule& stage, const at::Tensor& x,
                                      uint64_t shared_buffers, const ProfileOptions& options,
                                      MemoryTracker& tracker) {
  const at::NoGradGuard no_grad;
  const c10::Device device = x.device();
  NoGradForward result;
  std::vector<double> times;
  for (int r = 0; r < options.warmup() + options.repeats(); ++r) {
    result.output = at::Tensor();
    std::optional<detail::RngStash> stash;  // as the executor takes it, outside the measure
    std::optional<BufferCopies> buffers;    // likewise
    const int64_t modeled_draws = detail::modeled_random_draws();
    if (r == 0) {
      stash.emplace(std::vector<at::Tensor>{x}, detail::infer_device_type({x}));
      buffers.emplace(stage, shared_buffers, tracker);
    }
    tracker.reset_peak();
    const int64_t before = tracker.current_bytes();
    const auto start = detail::clock_now(device);
    result.output = stage.forward<at::Tensor>(x);
    const double time = seconds_since(start, device);
    result.tmp_bytes = std::max(
        result.tmp_bytes, tracker.peak_bytes() - before - allocated_storage_bytes(result.output));
    const bool modeled_draw = detail::modeled_random_draws() != modeled_draws;
    if (stash) {
      stash->note_forward_end();
      result.draws_random = stash->cpu_state().defined();
    }
    if (buffers) {
      result.buffer_bytes = buffers->all_bytes();
      result.kept_buffer_bytes = buffers->kept_bytes();
    }
    // Another thread's draws, or a random state it put back, move the generator too: seldom in
    // two runs, where a stage that draws moves it in each.
    if (stash && result.draws_random) result.draws_random = moves_cpu_generator(stage, x);
    if (stash && modeled_draw) result.draws_random = true;
    if (r >= options.warmup()) times.push_back(time);
  }
  result.time = median(times);
  return result;
}

void check_can_profile(const std::vector<torch::nn::AnyModule>& stages,
                       const at::Tensor& sample_input, const char* function) {
  TORCH_CHECK(!stages.empty(), function, ": the chain is empty.");
  TORCH_CHECK(!sample_input.is_meta() || detail::modeling_on_this_thread(), function,
              ": the memory of a meta sample input can't be measured on its own: meta tensors "
              "have shapes, no memory or time; profile it under a ckpt::ModeledDevice "
              "(<ckpt/modeled_device.h>) that says which device to count and time it as.");
  TORCH_CHECK(MemoryTracker::can_measure(sample_input.device()), function, ": the memory of ",
              sample_input.device(),
              " can't be measured with this LibTorch build (device memory needs LibTorch 2.9 or "
              "later and an accelerator whose allocator keeps statistics). Profile on the CPU, or "
              "plan from a chain measured elsewhere.");
}

// Memory of the sample's device: the counting allocator on the CPU, this thread's allocations
// only (threads profiling side by side must not see each other's), the caching allocator's
// statistics on an accelerator.
MemoryTracker tracker_for(c10::Device device) {
  return MemoryTracker(device, device.is_cpu() ? MemoryScope::CallingThread : MemoryScope::Process);
}

std::vector<std::shared_ptr<torch::nn::Module>> stage_modules(
    const std::vector<torch::nn::AnyModule>& stages) {
  std::vector<std::shared_ptr<torch::nn::Module>> modules;
  for (const auto& stage : stages) modules.push_back(stage.ptr());
  return modules;
}

// What the stages reach beyond their own modules.
struct OutsideReach {
  // Leaves that require grad and that no stage registers (a tensor, or a module's parameter, that
  // a Functional's lambda captures), and the bytes of their gradients by the stage whose backward
  // makes each first (the last that uses it).
  std::vector<at::Tensor> captured_leaves;
  std::vector<int64_t> gradient_bytes;
  // With a tracker: each stage's forward as `ForwardRecord` writes it, followed by the bytes
  // it held and its peak; empty where the record can't vouch for it.
  std::vector<std::string> records;
};

// A stage's parameters and buffers, in order.
std::vector<at::Tensor> owned_tensors(const torch::nn::AnyModule& stage) {
  std::vector<at::Tensor> owned = stage.ptr()->parameters();
  for (const at::Tensor& buffer : stage.ptr()->buffers()) owned.push_back(buffer);
  return owned;
}

// A stage that writes into its input (an in-place ReLU first in a stage): the profiler measures
// each stage on an input of its own, which such a stage would overwrite.
[[noreturn]] void refuse_writing_into_input(const char* function, size_t i,
                                            const std::string& error) {
  TORCH_CHECK(false, function, ": stage #", i,
              " writes into its input in place (an in-place ReLU or dropout, say)", error,
              ". The profiler measures each stage on an input of its own, which such a stage "
              "overwrites. Plan the chain with ckpt::PlannedSequential, which runs such a stage "
              "together with the stage before it, or make the stage write out of place.");
}

// The stage's forward on `input`, a leaf of the profiler's: autograd refuses a write into it
// where it requires grad.
at::Tensor forward_own_input(const torch::nn::AnyModule& stage, const at::Tensor& input,
                             const char* function, size_t i) {
  try {
    return torch::nn::AnyModule(stage).forward<at::Tensor>(input);
  } catch (const c10::Error& error) {
    const std::string message = error.what_without_backtrace();
    if (input.requires_grad() && message.find("in-place operation") != std::string::npos) {
      refuse_writing_into_input(function, i, " (autograd: \"" + message + "\")");
    }
    throw;
  }
}

// One grad-enabled forward of each stage, from a fresh leaf, before anything is measured: the
// captured leaves, whose gradients profiling must not leave in their `.grad` and the plan must
// count. A stage that writes into a tensor no stage owns (the running statistics of a module it
// does not register) is refused: profiling would move it, and a stage that runs again would move
// it twice or read what its first forward left. The caller restores the RNG and the buffers.
// With `tracker`, also each stage's record (`OutsideReach::records`).
OutsideReach survey_stages(const std::vector<torch::nn::AnyModule>& stages,
                           const at::Tensor& sample_input, const char* function,
                           MemoryTracker* tracker = nullptr) {
  const auto modules = stage_modules(stages);
  std::unordered_set<const c10::TensorImpl*> registered;
  for (const auto& module : modules) {
    for (const auto& p : module->parameters()) registered.insert(p.unsafeGetTensorImpl());
  }
  const at::AutoGradMode grad_mode(true);
  OutsideReach reach;
  reach.gradient_bytes.assign(stages.size(), 0);
  std::unordered_map<const c10::TensorImpl*, size_t> last_stage;
  bool input_grad = sample_input.requires_grad();
  at::Tensor x = sample_input.detach();
  for (size_t i = 0; i < stages.size(); ++i) {
    // The first stage runs on a copy: one that writes into its input must not write into the
    // caller's.
    const at::Tensor input = (i == 0 ? x.clone() : x.detach()).requires_grad_(input_grad);
    const int64_t input_version = input._version();
    at::Tensor output;
    std::optional<detail::ForwardRecord> recorder;
    if (tracker != nullptr) recorder.emplace(input, owned_tensors(stages[i]));
    const int64_t before = tracker != nullptr ? tracker->current_bytes() : 0;
    if (tracker != nullptr) tracker->reset_peak();
    {
      detail::OutsideStateWatch watch({input}, modules);  // puts back what the stage writes
      {
        const detail::DispatchModeGuard watching(watch);
        std::optional<detail::DispatchModeGuard> recording;
        if (recorder) recording.emplace(*recorder);
        output = forward_own_input(stages[i], input, function, i);
      }
      if (input._version() != input_version) refuse_writing_into_input(function, i, "");
      TORCH_CHECK(!watch.saw_writes(), function, ": stage #", i,
                  " writes into a tensor that no stage of the chain registers (the running "
                  "statistics of a module it reaches without registering it, such as one a "
                  "torch::nn::Functional's lambda captures). The planner could not count it, and "
                  "a stage that runs again would update it twice. Register that module in the "
                  "stage (a module of your own in place of the Functional), or checkpoint the "
                  "stage with ckpt::checkpoint, which puts such state back.");
    }
    for (const at::Tensor& leaf : detail::leaves_reached(output)) {
      const c10::TensorImpl* impl = leaf.unsafeGetTensorImpl();
      if (impl == input.unsafeGetTensorImpl() || registered.count(impl) != 0) continue;
      if (last_stage.emplace(impl, i).second) {
        reach.captured_leaves.push_back(leaf);
      } else {
        last_stage[impl] = i;
      }
    }
    if (recorder) {
      const int64_t held = tracker->current_bytes() - before;
      const int64_t peak = tracker->peak_bytes() - before;
      std::string record = recorder->finish(output);
      if (!record.empty())
        record += "held " + std::to_string(held) + " peak " + std::to_string(peak);
      reach.records.push_back(std::move(record));
    }
    input_grad = detail::is_differentiable(output);
    x = output.detach();
  }
  for (const at::Tensor& leaf : reach.captured_leaves) {
    reach.gradient_bytes[last_stage.at(leaf.unsafeGetTensorImpl())] +=
        detail::allocated_bytes_of(leaf);
  }
  return reach;
}

// One plain training step of the chain: a grad-enabled forward, and a backward from ones.
void run_plain_step(const std::vector<torch::nn::AnyModule>& stages,
                    const at::Tensor& sample_input) {
  const at::AutoGradMode grad_mode(true);
  at::Tensor x = sample_input.detach().requires_grad_(sample_input.requires_grad());
  for (auto stage : stages) x = stage.forward<at::Tensor>(x);
  if (x.requires_grad()) x.backward(at::ones_like(x));
}

struct PlainStep {
  double seconds = 0;
  int64_t peak_bytes = 0;  // above what lived before it
};

// A plain step from the gradients a training step starts from (none after zero_grad(), or
// buffers it accumulates into), so that measuring never needs more memory than the step itself.
PlainStep measure_plain_step(const std::vector<torch::nn::AnyModule>& stages,
                             const at::Tensor& sample_input, const ProfileOptions& options,
                             MemoryTracker& tracker) {
  const SwappedGradients grads(stage_modules(stages), options.count_parameter_gradients()
                                                          ? SwappedGradients::Start::None
                                                          : SwappedGradients::Start::ZeroBuffers);
  tracker.reset_peak();
  const int64_t before = tracker.current_bytes();
  const auto start = detail::clock_now(sample_input.device());
  run_plain_step(stages, sample_input);
  const double seconds = seconds_since(start, sample_input.device());
  return {seconds, tracker.peak_bytes() - before};
}

// Scales the chain's times so that its plain step, as the simulator predicts it, takes the median
// measured plain step. Stages timed one by one miss what a step shares between them (warm caches,
// the allocator's free lists) and add what isolating each of them costs. One factor for the whole
// chain leaves every plan as it was. `plain_peak` gets the steps' peak.
plan::Chain calibrated_to_step(plan::Chain chain, const std::vector<torch::nn::AnyModule>& stages,
                               const at::Tensor& sample_input, const ProfileOptions& options,
                               MemoryTracker& tracker, int64_t& plain_peak) {
  std::vector<double> times;
  for (int r = 0; r < options.warmup() + options.repeats(); ++r) {
    const PlainStep step = measure_plain_step(stages, sample_input, options, tracker);
    plain_peak = std::max(plain_peak, step.peak_bytes);
    if (r >= options.warmup()) times.push_back(step.seconds);
  }
  const double predicted = plan::simulate(chain, plan::solve_no_checkpoint(chain)).time;
  const double measured = median(times);
  if (!(predicted > 0 && measured > 0)) return chain;  // nothing measurable to scale
  return plan::scale_times(std::move(chain), measured / predicted);
}

// Measures the stage in each storage mode the options turn on, and offers the planner those that
// keep less than the plain stage (`full_saved` bytes) and that no mode offered before matches
// with a backward that holds no more ("two_pass" keeps what "checkpointed" keeps, and is offered
// where its backward holds less).
void offer_storage_modes(torch::nn::AnyModule& stage, const at::Tensor& x, bool input_grad,
                         const Leaves& single_stage_leaves, const ProfileOptions& options,
                         MemoryTracker& tracker, int64_t full_saved, plan::Stage& measured) {
  const StorageSettings settings{options.selective_policy()};
  for (const StorageMode& mode : options.storage_modes().all()) {
    const std::optional<CheckpointOptions> region = mode.region_on(settings, x.device());
    if (!region) continue;
    plan::StorageOption option = measure_full_storage(
        stage, stage_forward(stage, region), x, input_grad, single_stage_leaves, options, tracker);
    option.name = mode.name;
    bool useful = option.saved_bytes < full_saved;
    for (const auto& offered : measured.alternatives) {
      useful = useful && (option.saved_bytes != offered.saved_bytes ||
                          option.offloaded_bytes != offered.offloaded_bytes ||
                          option.backward_tmp_bytes < offered.backward_tmp_bytes);
    }
    if (useful) measured.alternatives.push_back(std::move(option));
  }
}

// The bytes of one copy of the random state that the tracker counts: the CPU generator's on the
// CPU; none on an accelerator, whose tracker counts device memory (the states are host tensors);
// the modeled device's where a meta sample runs under one.
int64_t random_state_bytes(const at::Tensor& sample_input) {
  if (sample_input.is_meta()) return detail::modeled_random_state_bytes();
  return sample_input.device().is_cpu() ? detail::cpu_random_state_bytes() : 0;
}

// Runs a stage's forward and backward once, unmeasured, on an accelerator: the first call of
// each kernel loads its code and picks its algorithms (CUDA's lazy module loading, cuDNN's
// heuristics), and the first matrix product makes the BLAS workspace. Measured, that once-only
// cost went to the plain option measured first: on an H200, ResNet plans that recompute were
// predicted at a tenth of the plain step's time.
void warm_up_on_accelerator(torch::nn::AnyModule& stage, const at::Tensor& x, bool input_grad) {
  if (x.device().is_cpu() || x.is_meta()) return;
  const SwappedGradients discarded({stage.ptr()}, SwappedGradients::Start::None);
  const at::Tensor input = x.detach().requires_grad_(input_grad);
  const at::Tensor output = stage.forward<at::Tensor>(input);
  if (output.requires_grad()) torch::autograd::backward({output}, {at::ones_like(output)});
  compat::synchronize(x.device());
}

// Measures one stage on its input into `measured`: the sizes and times of the planner's model,
// and the storage options that keep less than the plain stage. `shared_buffers`: the buffers it
// shares with other stages (`buffers_shared_between`). Returns the stage's output.
at::Tensor measure_stage(torch::nn::AnyModule& stage, const at::Tensor& x, bool input_grad,
                         const Leaves& single_stage_leaves, uint64_t shared_buffers,
                         const ProfileOptions& options, MemoryTracker& tracker,
                         plan::Stage& measured) {
  warm_up_on_accelerator(stage, x, input_grad);
  const plan::StorageOption full = measure_full_storage(stage, stage_forward(stage), x, input_grad,
                                                        single_stage_leaves, options, tracker);
  offer_storage_modes(stage, x, input_grad, single_stage_leaves, options, tracker, full.saved_bytes,
                      measured);
  NoGradForward no_grad = measure_no_grad_forward(stage, x, shared_buffers, options, tracker);
  measured.forward_time = no_grad.time;
  measured.forward_all_time = full.forward_time;
  measured.backward_time = full.backward_time;
  measured.output_bytes = allocated_storage_bytes(no_grad.output);
  measured.saved_bytes = std::max(full.saved_bytes, measured.output_bytes);
  measured.forward_tmp_bytes = std::max<int64_t>(no_grad.tmp_bytes, 0);
  measured.forward_all_tmp_bytes = full.forward_tmp_bytes;
  measured.backward_tmp_bytes = full.backward_tmp_bytes;
  measured.random_state_bytes = no_grad.draws_random ? random_state_bytes(x) : 0;
  measured.buffer_bytes = no_grad.buffer_bytes;
  measured.kept_buffer_bytes = no_grad.kept_buffer_bytes;
  for (auto& option : measured.alternatives) {
    option.saved_bytes = std::max(option.saved_bytes, measured.output_bytes);
    if (option.offloaded_bytes > 0) {
      // The planner adds the copies (docs/memory-model.md, "Offloading"): the option's times are
      // its compute, the plain stage's.
      option.forward_time = full.forward_time;
      option.backward_time = full.backward_time;
    }
  }
  return std::move(no_grad.output);
}

// The earlier stage whose measurement stage `i` may take over: one whose forward wrote the same
// record, where neither shares buffers or parameters with another stage (the executor keeps
// and collects those apart); none where the stage is the first of its kind.
std::optional<size_t> repeated_stage(const torch::nn::AnyModule& stage, size_t i,
                                     const OutsideReach& reach, const Leaves& single_stage_leaves,
                                     const std::vector<uint64_t>& shared_buffers,
                                     std::unordered_map<std::string, size_t>& first_with) {
  if (i >= reach.records.size() || reach.records[i].empty() || shared_buffers[i] != 0) {
    return std::nullopt;
  }
  for (const at::Tensor& parameter : stage.ptr()->parameters()) {
    if (single_stage_leaves.count(parameter.unsafeGetTensorImpl()) == 0) return std::nullopt;
  }
  const auto [found, first] = first_with.emplace(reach.records[i], i);
  if (first) return std::nullopt;
  return found->second;
}

// The bandwidth of offloading's copies, measured on the largest data a stage offloads (at least
// 1 MiB, at most 256 MiB); 0 where no stage offloads.
double host_bandwidth_of(const plan::Chain& chain, c10::Device device) {
  int64_t largest = 0;
  for (const plan::Stage& stage : chain.stages) {
    for (const plan::StorageOption& option : stage.alternatives)
      largest = std::max(largest, option.offloaded_bytes);
  }
  if (largest == 0) return 0.0;
  return measure_host_bandwidth(device, std::clamp<int64_t>(largest, 1 << 20, 256 << 20));
}

// profile_chain, and with calibrate_to_step the peak of its plain steps in `plain_peak`.
plan::Chain profile_and_calibrate(const std::vector<torch::nn::AnyModule>& stages,
                                  const at::Tensor& sample_input, const ProfileOptions& options,
                                  int64_t* plain_peak) {
  check_can_profile(stages, sample_input, "ckpt::profile_chain");
  TORCH_CHECK(options.repeats() >= 1, "ckpt::profile_chain: repeats must be at least 1, but got ",
              options.repeats(), ".");
  MemoryTracker tracker = tracker_for(sample_input.device());
  // Profiling runs the stages many times: leave the RNG and the buffers as they were. Each
  // offloaded stage is measured alone: no data brought back ahead across stages.
  const detail::ManualOffloadScope offloads;
  const detail::RngRestore generators({sample_input}, detail::infer_device_type({sample_input}));
  const detail::BufferGuard buffers(stage_modules(stages));
  const OutsideReach reach = survey_stages(stages, sample_input, "ckpt::profile_chain",
                                           options.reuse_repeated_stages() ? &tracker : nullptr);
  const SwappedGradients captured_gradients(reach.captured_leaves);

  plan::Chain chain;
  chain.input_bytes = allocated_storage_bytes(sample_input);
  chain.random_state_bytes = random_state_bytes(sample_input);
  std::vector<int64_t> gradient_bytes = gradient_bytes_per_stage(stages);
  for (size_t i = 0; i < stages.size(); ++i) gradient_bytes[i] += reach.gradient_bytes[i];
  const Leaves single_stage_leaves = detail::single_stage_leaves(stages);
  const std::vector<uint64_t> shared_buffers =
      detail::buffers_shared_between(stage_modules(stages));
  std::unordered_map<std::string, size_t> first_with_record;
  at::Tensor x = sample_input.detach();
  for (size_t i = 0; i < stages.size(); ++i) {
    auto stage = stages[i];
    const std::optional<size_t> earlier =
        repeated_stage(stage, i, reach, single_stage_leaves, shared_buffers, first_with_record);
    plan::Stage measured{};
    if (earlier) {
      measured = chain.stages[*earlier];
      const at::NoGradGuard no_grad;  // only its output, for the next stage
      x = stage.forward<at::Tensor>(x);
    } else {
      const SwappedGradients grads({stage.ptr()}, SwappedGradients::Start::None);
      const bool input_grad = i > 0 ? detail::is_differentiable(x) : sample_input.requires_grad();
      x = measure_stage(stage, x, input_grad, single_stage_leaves, shared_buffers[i], options,
                        tracker, measured);
    }
    measured.gradient_bytes = options.count_parameter_gradients() ? gradient_bytes[i] : 0;
    chain.stages.push_back(measured);
  }
  x = at::Tensor();  // the last stage's output would sit beside the plain step
  if (options.calibrate_to_step()) {
    int64_t peak = 0;
    chain = calibrated_to_step(std::move(chain), stages, sample_input, options, tracker, peak);
    if (plain_peak != nullptr) *plain_peak = peak;
  }
  // In seconds, as the calibrated times are: the copies are measured as they run.
  chain.host_bandwidth = host_bandwidth_of(chain, sample_input.device());
  return chain;
}

}  // namespace

int64_t measure_no_checkpoint_peak(const std::vector<torch::nn::AnyModule>& stages,
                                   const at::Tensor& sample_input, const ProfileOptions& options) {
  check_can_profile(stages, sample_input, "ckpt::measure_no_checkpoint_peak");
  MemoryTracker tracker = tracker_for(sample_input.device());
  const detail::RngRestore generators({sample_input}, detail::infer_device_type({sample_input}));
  const detail::BufferGuard buffers(stage_modules(stages));
  const OutsideReach reach =
      survey_stages(stages, sample_input, "ckpt::measure_no_checkpoint_peak");
  const SwappedGradients captured_gradients(reach.captured_leaves);
  return measure_plain_step(stages, sample_input, options, tracker).peak_bytes;
}

plan::Chain profile_chain(const std::vector<torch::nn::AnyModule>& stages,
                          const at::Tensor& sample_input, const ProfileOptions& options) {
  return profile_and_calibrate(stages, sample_input, options, nullptr);
}

MeasuringProfiler::PlainPeak MeasuringProfiler::key_of(
    const std::vector<torch::nn::AnyModule>& stages, const at::Tensor& sample_input) {
  PlainPeak key;
  for (const auto& stage : stages) key.stages.push_back(stage.ptr().get());
  key.sample = sample_input.unsafeGetTensorImpl();
  return key;
}

plan::Chain MeasuringProfiler::profile(const std::vector<torch::nn::AnyModule>& stages,
                                       const at::Tensor& sample_input) {
  int64_t peak = -1;
  plan::Chain chain = profile_and_calibrate(stages, sample_input, options_, &peak);
  const std::lock_guard<std::mutex> lock(mutex_);
  plain_peak_.reset();
  if (peak >= 0) {
    plain_peak_ = key_of(stages, sample_input);
    plain_peak_->bytes = peak;
  }
  return chain;
}

int64_t MeasuringProfiler::no_checkpoint_peak(const std::vector<torch::nn::AnyModule>& stages,
                                              const at::Tensor& sample_input) {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    const PlainPeak key = key_of(stages, sample_input);
    const bool same =
        plain_peak_ && plain_peak_->stages == key.stages && plain_peak_->sample == key.sample;
    const int64_t bytes = same ? plain_peak_->bytes : -1;
    plain_peak_.reset();
    if (same) return bytes;
  }
  return measure_no_checkpoint_peak(stages, sample_input, options_);
}

}  // namespace ckpt
