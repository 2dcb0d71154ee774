#pragma once

/// \file
/// Measuring any model for the planner: `profile_model` runs real training steps of a model whose
/// `forward` marks candidates (`ckpt::candidate`, <ckpt/candidate.h>) and turns them into the
/// planner's timeline model (`plan::ModelProfile`, <ckpt/plan/model.h>).

#include <ckpt/plan/model.h>
#include <ckpt/selective.h>
#include <ckpt/storage_mode.h>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <torch/arg.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace ckpt {

/// The shape of a tensor a candidate took in the profiled step.
struct TensorShape {
  std::vector<int64_t> sizes;
  c10::ScalarType dtype = c10::ScalarType::Float;
  c10::Device device = c10::Device(c10::DeviceType::CPU);
  /// Whether it required grad: the operators that read a tensor that does keep more for the
  /// backward (a matrix product keeps its other factor to compute that tensor's gradient).
  bool requires_grad = false;

  static TensorShape of(const at::Tensor& tensor);
  /// Whether `tensor` needs no more memory than this: same dtype, device and number of
  /// dimensions, no dimension larger, and not requiring grad where this did not.
  bool holds(const at::Tensor& tensor) const { return holds(of(tensor)); }
  /// The same for a tensor of shape `shape`.
  bool holds(const TensorShape& shape) const;
  std::string to_string() const;
};

/// A candidate as the profiled step reached it, in the order of the forward.
struct ProfiledCandidate {
  std::string name;
  /// Its input tensors (undefined ones included, as an empty shape of dtype Undefined).
  std::vector<TensorShape> inputs;

  /// Candidate `name` reached with `inputs`.
  static ProfiledCandidate of(std::string name, const std::vector<at::Tensor>& inputs);
};

/// Options of `profile_model`.
struct ModelProfileOptions {
  /// The storage modes to measure each candidate in, beside keeping everything ("stored"). A mode
  /// is offered where it keeps less than "stored" and differs from the modes before it;
  /// "offloaded" only on an accelerator. Default: `StorageModes::defaults()`
  TORCH_ARG(StorageModes, storage_modes) = StorageModes::defaults();
  /// The policy of the "selective" mode; an empty one turns it off. Default: `save_matmuls()`
  TORCH_ARG(SelectivePolicy, selective_policy) = save_matmuls();
  /// Measure the steps starting without parameter gradients (after `zero_grad()`), so that those
  /// the backward creates count; false where they exist before every step. Default: true
  TORCH_ARG(bool, count_parameter_gradients) = true;
  /// Replay the RNG in recomputes of the measured modes. Default: true
  TORCH_ARG(bool, preserve_rng_state) = true;
  /// Also measure the "recomputed" mode (`kRecomputedMode`), where "checkpointed" is among the
  /// storage modes: the candidate runs checkpointed, and the candidates that take its outputs
  /// (which must then run "checkpointed") don't keep them, but run it again in their backward to
  /// get them. Its outputs' memory is free from where the model lets go of them until then.
  /// Measured in extra steps (about L + 1 for chains of L), each running some candidates so.
  /// Where a candidate's outputs go to one beyond the longest chain from it (a U-Net encoder's
  /// skip), every length is measured again with the chains' starts recomputed for their first
  /// taker only, later ones keeping theirs ("recomputed, skips kept", "recomputed, chain of 2,
  /// skips kept"). Default: true
  TORCH_ARG(bool, recompute_outputs) = true;
  /// The longest chain of "recomputed" candidates measured: with 2 or more, a candidate whose
  /// inputs are themselves recomputed outputs may be recomputed too (running it again runs its
  /// producers again), so a plan may let go of several boundaries in a row. Each length costs
  /// extra steps (about one more than the length). Default: 4
  TORCH_ARG(int, max_recompute_chain) = 4;
  /// Host memory the profiling steps may hold offloaded: each offloaded step offloads only the
  /// candidates this holds (each counted at what its plain forward leaves live on the device,
  /// more than it offloads), in as many steps as that takes, and never a candidate that alone
  /// would not fit (it gets no "offloaded" option). `PlannedModel` passes its own. Default:
  /// unlimited (one step offloads every candidate)
  TORCH_ARG(int64_t, host_budget_bytes) = std::numeric_limits<int64_t>::max();
};

/// The name of the "recomputed" option in a `MeasuredModel` and a plan: the option that ends a
/// chain of one; a longer chain's is `recomputed_mode(length)`.
inline constexpr const char* kRecomputedMode = "recomputed";

/// The name of the "recomputed" option that ends a chain of `length` recomputed candidates
/// (`plan::OptionRun::recomputed(length).name()`).
inline std::string recomputed_mode(int length) {
  return plan::OptionRun::recomputed(length).name();
}

/// The measured step: the planner's model, and what the executor checks each step against.
struct MeasuredModel {
  /// Option 0 of every candidate is "stored"; the others are named after their storage modes.
  plan::ModelProfile profile;
  /// The candidates of `profile`, in the same order, with their inputs' shapes.
  std::vector<ProfiledCandidate> candidates;
  /// Where the step ran (its memory was measured there).
  c10::Device device = c10::Device(c10::DeviceType::CPU);
};

/// Measures the training step `loss_fn` (a forward through `model` to a scalar loss; backward is
/// run for it) as the planner's timeline: an untimed plain forward that finds the candidates, a
/// plain step in which every candidate keeps everything, one step per storage mode in which every
/// candidate runs in that mode (but a selective policy's mode that, the first forward shows, would
/// keep all but 1% of what each candidate saves inside it), one more per mode that keeps less than
/// the plain step somewhere, where some candidate takes another's output without saving it (a U-Net
/// decoder's concatenation of its skip: those takers kept, for the "<mode>, takers kept" options),
/// for candidates with parts marked inside them, one more (and its kept-takers twin) with their
/// parts checkpointed too, and, for the "recomputed" options, more with every candidate
/// checkpointed and some recomputing their outputs (up to L + 1 for chains of L). Each records, at
/// every candidate's forward and backward boundaries, the live bytes, the peak since the last
/// boundary and the time (docs/memory-model.md, "Any model"). A candidate reached again in the
/// step is a candidate of its own, named after its call ("d.0#2": `detail::CandidateCalls`). The
/// parameters' gradients, the buffers (BatchNorm statistics) and the RNG state are left as they
/// were. Errors: a module candidate outside `model`, no candidate at all, steps whose candidates
/// differ or take tensors of other shapes, a loss that isn't a scalar requiring grad.
MeasuredModel profile_model(const std::shared_ptr<torch::nn::Module>& model,
                            const std::function<at::Tensor()>& loss_fn,
                            const ModelProfileOptions& options = {});

/// `profile_model` in parts, for a planner that measures only what its budget needs: the
/// constructor measures the plain step and every storage mode, `measure_more` the options that
/// save memory for more recompute, one group at a time: first, where candidates have parts, those
/// candidates with their parts checkpointed (one or two steps), then the "recomputed" chains one
/// length longer at a time (each length about L + 1 more steps); `measured()` gives what is
/// measured so far as the planner's model. Each call runs the step
/// (the same step each time: the same candidates in the same order) and leaves the parameters'
/// gradients, the buffers and the RNG state as they were. One thread uses it at a time.
///
/// Example:
/// ```
/// ckpt::ModelProfiler profiler(model, loss_fn);
/// while (!profiler.complete() && !good_enough(profiler.measured())) {
///   profiler.measure_more(loss_fn);
/// }
/// ```
class ModelProfiler {
 public:
  /// Measures the plain step and each storage mode; the errors are `profile_model`'s.
  ModelProfiler(const std::shared_ptr<torch::nn::Module>& model,
                const std::function<at::Tensor()>& loss_fn,
                const ModelProfileOptions& options = {});
  ~ModelProfiler();
  ModelProfiler(ModelProfiler&&) noexcept;
  ModelProfiler& operator=(ModelProfiler&&) noexcept;

  /// The longest chain of "recomputed" candidates measured so far (0: none).
  int chains_measured() const;
  /// Whether every option the options ask for is measured: the candidates' parts, and chains up
  /// to `max_recompute_chain` (none where the "recomputed" mode is off).
  bool complete() const;
  /// Measures the next group of options, running `loss_fn`, the step measured at construction:
  /// the candidates with parts checkpointed with their parts checkpointed too (where any has
  /// parts and they are not measured yet), else the chains one candidate longer than
  /// `chains_measured()`. An error once `complete()`.
  void measure_more(const std::function<at::Tensor()>& loss_fn);
  /// What is measured so far, as `profile_model` gives it once complete.
  MeasuredModel measured() const;

  /// The steps measured so far (defined where they are measured).
  struct State;

 private:
  std::unique_ptr<State> state_;
};

namespace detail {
/// Names module candidates after their path in a model ("encoder.2").
class CandidateNames {
 public:
  explicit CandidateNames(const torch::nn::Module& model);
  /// The candidate's name, as `CandidateRunner::begin` spells it; an error when `module` is
  /// outside the model.
  std::string resolve(const std::string& name, const torch::nn::Module* module) const;

 private:
  std::unordered_map<const torch::nn::Module*, std::string> paths_;
};

/// Names the candidates of one step in the order the step reaches them. A candidate reached again
/// in the same step (a discriminator applied to real and to generated samples, a layer whose
/// weights several depths share) is a candidate of its own, named after its call: "d.0", then
/// "d.0#2", "d.0#3". The profiler and `PlannedModel` name a step's calls alike, so that a plan
/// finds each call again.
class CandidateCalls {
 public:
  explicit CandidateCalls(const CandidateNames& names) : names_(names) {}
  /// The name of this call of candidate `name` (`CandidateNames::resolve`'s): that name at its
  /// first call, numbered after it at later ones, never a name an earlier call took.
  std::string name(const std::string& name, const torch::nn::Module* module);

 private:
  const CandidateNames& names_;
  std::unordered_set<std::string> taken_;
  std::unordered_map<std::string, int> later_calls_;  // by name: the later calls numbered so far
};

/// Raises the error for a step function whose result is not the step's loss (one number that
/// requires grad): profiled, or run under a plan.
void check_step_loss(const at::Tensor& loss);

/// The region a candidate runs as in `mode` on `device`, both while profiled and under a plan
/// (std::nullopt where `settings` or the device turn the mode off): the mode's region, replaying
/// the random state as `preserve_rng_state` says, and, where it offloads, without the region's
/// own look-ahead (`OffloadOptions::look_ahead(0)`), which would bring back the data of whichever
/// region the plan offloads before it (random plans of a small transformer on the emulated device
/// peaked up to 23% above their predictions). The profiler and `PlannedModel` bring a candidate's
/// data back themselves, when its backward begins, and the plan's look-ahead earlier
/// (`plan::ModelPlan::look_ahead`).
std::optional<CheckpointOptions> candidate_region(const StorageMode& mode,
                                                  const StorageSettings& settings,
                                                  c10::Device device, bool preserve_rng_state);
}  // namespace detail

}  // namespace ckpt
