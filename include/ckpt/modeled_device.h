#pragma once

/// \file
/// Planning without the device: a step runs on LibTorch's meta device (shapes, no data), its
/// allocations are counted as a chosen device's allocator would count them, and its operators are
/// timed by a cost model of that device. `ckpt::profile_chain` and `ckpt::profile_model` then
/// measure a model for an accelerator the machine does not have (docs/any-model.md, "Planning
/// without the device").
///
/// Example:
/// ```
/// ckpt::DeviceProfile device = ckpt::DeviceProfile::load("h100.json");
/// ckpt::move_to_meta(*model);
/// ckpt::ModeledDevice modeled(device);
/// plan::Chain chain = ckpt::profile_chain(stages, torch::empty({64, 1024}, torch::kMeta));
/// ```

#include <ckpt/profiler.h>

#include <c10/core/Device.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ckpt {

/// What the planner needs to know of a device it does not run on: its memory, how its allocator
/// rounds, and a cost model of its operators (the time of an operator is
/// `seconds_per_operator + max(flops / flops_per_second, bytes / bytes_per_second)`, where `flops`
/// counts matrix products and convolutions and `bytes` what the operator reads and writes).
struct DeviceProfile {
  /// A name for reports ("NVIDIA H100 80GB", "cpu").
  std::string name;
  /// The device's memory; 0 where unknown.
  int64_t memory_bytes = 0;
  /// Every allocation is rounded up to a multiple of this: 512 for CUDA's caching allocator (and
  /// ckpt's emulated accelerator), 1 for the CPU's counting allocator.
  int64_t allocation_granularity = 1;
  /// Floating-point operations per second of matrix products and convolutions.
  double flops_per_second = 1e12;
  /// Bytes per second that operators read and write.
  double bytes_per_second = 1e11;
  /// The fixed cost of one operator (a kernel launch).
  double seconds_per_operator = 5e-6;
  /// Count the scratch memory that CPU kernels take beside their inputs and outputs (a
  /// convolution's unfolded input): convolutions, and operators without a meta kernel, run once
  /// per shape on zero-filled CPU tensors, and their scratch peak is charged as a short-lived
  /// allocation. Right for the CPU, whose kernels these are; an accelerator's differ (false).
  bool count_cpu_scratch = false;
  /// Bytes of one random-number state in the memory the budget counts: the CPU generator's
  /// (5056 with LibTorch 2.x) for the CPU, where a planned chain stashes it for each stage that
  /// runs again (docs/memory-model.md, "Random state"); 0 for an accelerator, whose generators'
  /// states are host tensors. Default: 0
  int64_t random_state_bytes = 0;

  /// Reads a profile written by `save` (or by `ckpt bench --device-profile FILE`). Errors: a file
  /// that can't be read, a field missing or out of range.
  static DeviceProfile load(const std::string& path);
  /// Writes the profile as JSON.
  void save(const std::string& path) const;
  /// Measures `device` with a few timed operators (a matrix product, a large copy, many small
  /// operators): about a second. The memory comes from the device where LibTorch tells it (0
  /// otherwise); the granularity is the one of its allocator.
  static DeviceProfile measure(c10::Device device);
};

/// Moves every parameter and buffer of `module` (and of its submodules) to the meta device in
/// place: same shapes, dtypes and `requires_grad`, no data. The module's own members (a Linear's
/// `weight`) see the change, since the tensors themselves move. Their values are lost: plan with a
/// copy, or build the model for planning only.
void move_to_meta(torch::nn::Module& module);

/// While alive, operators on meta tensors on this thread run as on `profile`'s device: each
/// allocation is counted with its granularity (`ckpt::MemoryTracker(torch::kMeta)` reads the
/// count), the profilers' clock advances by the cost model, and operators LibTorch has no meta
/// kernel for run on zero-filled CPU tensors of the same shapes. A step that reads values (an
/// `.item()`, an output whose size depends on values such as `nonzero` or a boolean mask) is
/// refused with an error that names the operator. One at a time in the process (the meta
/// allocation count is the process's); not nested.
class ModeledDevice {
 public:
  explicit ModeledDevice(const DeviceProfile& profile);
  ~ModeledDevice();
  ModeledDevice(const ModeledDevice&) = delete;
  ModeledDevice& operator=(const ModeledDevice&) = delete;

  const DeviceProfile& profile() const;
  /// Seconds of modeled time since construction.
  double seconds() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

/// A `ChainProfiler` for `PlannedSequential` that plans without the device: while it profiles, the
/// stages' parameters and buffers are meta tensors (their data, and the gradients, come back
/// afterwards), and a meta sample of the input's shape runs under a `ModeledDevice` of `device`.
/// The model's values are neither read nor changed; don't run the model on other threads while
/// it plans.
///
/// Example:
/// ```
/// auto profiler = std::make_shared<ckpt::ModeledProfiler>(ckpt::DeviceProfile::load("h100.json"));
/// ckpt::PlannedSequential planned(model, ckpt::Budget::parse("60GiB"),
///                                 ckpt::PlannedSequentialOptions().profiler(profiler));
/// ```
class ModeledProfiler : public ChainProfiler {
 public:
  explicit ModeledProfiler(DeviceProfile device, ProfileOptions options = {})
      : device_(std::move(device)), options_(options) {}
  plan::Chain profile(const std::vector<torch::nn::AnyModule>& stages,
                      const at::Tensor& sample_input) override;
  int64_t no_checkpoint_peak(const std::vector<torch::nn::AnyModule>& stages,
                             const at::Tensor& sample_input) override;

 private:
  DeviceProfile device_;
  ProfileOptions options_;
};

}  // namespace ckpt
