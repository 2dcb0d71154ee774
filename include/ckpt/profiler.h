#pragma once

/// \file
/// Measuring a chain for the planner: `profile_chain`, the plain step's peak, and the profiler
/// interface that `ckpt::PlannedSequential` plans through.

#include <ckpt/plan/chain.h>
#include <ckpt/selective.h>
#include <ckpt/storage_mode.h>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>
#include <torch/nn/modules/container/any.h>

#include <c10/util/Optional.h>

#include <cstdint>
#include <mutex>
#include <vector>

namespace ckpt {

/// What `PlannedSequential` needs to plan from a sample input: the chain's costs in the planner's
/// model, and the peak of one plain step. `ckpt::MeasuringProfiler` (<ckpt/profiler.h>) is the
/// one `ckpt::PlannedSequential` supplies; supply another to plan from stored measurements.
class ChainProfiler {
 public:
  virtual ~ChainProfiler() = default;
  /// The chain's per-stage times and sizes on `sample_input`.
  virtual plan::Chain profile(const std::vector<torch::nn::AnyModule>& stages,
                              const at::Tensor& sample_input) = 0;
  /// The peak bytes of one plain training step of the chain on `sample_input`.
  virtual int64_t no_checkpoint_peak(const std::vector<torch::nn::AnyModule>& stages,
                                     const at::Tensor& sample_input) = 0;
};

/// Options for `profile_chain`.
struct ProfileOptions {
  /// Timed repetitions of each stage's forward and backward; the median is kept. One is enough
  /// for the memory sizes, which don't vary, and keeps planning to a few plain steps' time; more
  /// give steadier times. Default: 1
  TORCH_ARG(int, repeats) = 1;
  /// Untimed repetitions before timing. On an accelerator each stage also runs once, unmeasured,
  /// before its first measure (first calls load kernels and pick algorithms). Default: 0
  TORCH_ARG(int, warmup) = 0;
  /// The storage modes to measure each stage in, beside the plain forward. A mode is offered to
  /// the planner as a storage option named after it where it keeps less than the plain stage and
  /// differs from the modes offered before it (a selective policy that saves nothing of a stage
  /// keeps what "checkpointed" keeps). `StorageModes()` offers none. Default:
  /// `StorageModes::defaults()`
  TORCH_ARG(StorageModes, storage_modes) = StorageModes::defaults();
  /// The policy of the "selective" storage mode; an empty policy turns it off.
  /// Default: `save_matmuls()`
  TORCH_ARG(SelectivePolicy, selective_policy) = save_matmuls();
  /// Scale every stage's times by one factor, so that the plain chain's predicted step equals
  /// the median of `repeats` measured plain training steps of the whole chain. Stages timed one
  /// by one miss what a step shares between them and add what isolating each costs; the factor
  /// makes predicted step times measured ones, and leaves every plan as it was. Default: true
  TORCH_ARG(bool, calibrate_to_step) = true;
  /// Count the parameter gradients each stage's backward creates (`plan::Stage::gradient_bytes`),
  /// and measure the plain step's peak starting without gradients: the step after `zero_grad()`,
  /// which sets them to none (the default since LibTorch 2.0), and any first step. False where
  /// they exist before every step (`zero_grad(false)`): then they are part of what lives before
  /// the step, and neither counts them. Default: true
  TORCH_ARG(bool, count_parameter_gradients) = true;
  /// Measure a stage once and give later stages whose forwards are the same its measurement (a
  /// transformer's blocks, a ResNet's blocks after the first of each stage): the same operators on
  /// tensors of the same shapes, from the same places (the input, the k-th parameter, the n-th
  /// result), recording the same autograd nodes, holding and peaking at the same bytes. A stage
  /// with a node of its own (a custom `Function`), a hook, a generator argument, or parameters or
  /// buffers shared with another stage is measured as usual (docs/memory-model.md, "Repeated
  /// stages"). Default: true
  TORCH_ARG(bool, reuse_repeated_stages) = true;
};

/// Measures each stage of a chain on a sample input: forward and backward time (median, seconds)
/// and the sizes of the planner's memory model (input, output, what a grad-enabled forward keeps,
/// forward temporaries of each forward mode, backward temporaries, the parameter gradients each
/// backward creates), counted by the counting allocator. A stage also gets a storage option for
/// each of `options.storage_modes()` that keeps less (see `ProfileOptions::storage_modes`), which
/// `PlannedSequential` runs with the same modes. Buffers (BatchNorm statistics), the RNG state and
/// `sample_input` are left as they were. A stage that writes into its input in place (an
/// in-place ReLU) is an error: each stage is measured on an input of its own, which it would
/// overwrite (`PlannedSequential` runs such a stage together with the one before it).
///
/// Example:
/// ```
/// plan::Chain chain = ckpt::profile_chain(stages, x);
/// ```
plan::Chain profile_chain(const std::vector<torch::nn::AnyModule>& stages,
                          const at::Tensor& sample_input, const ProfileOptions& options = {});

/// Measures the peak memory of one plain training step of the chain on `sample_input` (forward
/// and backward, nothing checkpointed) above what lived before it, with the counting allocator
/// (the caching allocator's statistics on an accelerator). With
/// `options.count_parameter_gradients()` the step starts without parameter gradients, so those
/// its backward creates before the peak count; otherwise they exist beforehand. The gradients,
/// buffers and RNG state are left as they were.
int64_t measure_no_checkpoint_peak(const std::vector<torch::nn::AnyModule>& stages,
                                   const at::Tensor& sample_input,
                                   const ProfileOptions& options = {});

/// The profiler `PlannedSequential` plans with: `profile_chain` and `measure_no_checkpoint_peak`.
/// The plain step that `profile` runs to calibrate also answers `no_checkpoint_peak` for the same
/// stages and sample right after it, so planning runs one plain step fewer.
class MeasuringProfiler : public ChainProfiler {
 public:
  explicit MeasuringProfiler(ProfileOptions options = {}) : options_(options) {}
  plan::Chain profile(const std::vector<torch::nn::AnyModule>& stages,
                      const at::Tensor& sample_input) override;
  int64_t no_checkpoint_peak(const std::vector<torch::nn::AnyModule>& stages,
                             const at::Tensor& sample_input) override;

 private:
  struct PlainPeak {
    std::vector<const torch::nn::Module*> stages;
    const c10::TensorImpl* sample = nullptr;
    int64_t bytes = 0;
  };
  static PlainPeak key_of(const std::vector<torch::nn::AnyModule>& stages,
                          const at::Tensor& sample_input);

  ProfileOptions options_;
  std::mutex mutex_;
  c10::optional<PlainPeak> plain_peak_;  // of the last profile, until asked for
};

}  // namespace ckpt
