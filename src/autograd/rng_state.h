#pragma once

// Stashing the RNG state at forward time and replaying it during the recompute.

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>

#include <vector>

namespace ckpt {
namespace detail {

/// Whether two generator states (byte tensors from `Generator::get_state`) are identical.
bool same_state(const at::Tensor& a, const at::Tensor& b);

/// Bytes of one copy of the CPU generator's state (5056 with LibTorch 2.x).
int64_t cpu_random_state_bytes();

/// The device type whose RNG is preserved for these tensor arguments (DefaultDeviceType rules).
c10::DeviceType infer_device_type(const std::vector<at::Tensor>& tensors);

/// The RNG states of the CPU and of the devices of one accelerator type among a region's arguments
/// (any type this LibTorch has hooks for: CUDA, XPU, MPS, PrivateUse1, ...).
class RngStash {
 public:
  /// Reads the current states: the CPU's, and those of `device_type`'s devices that `inputs` use,
  /// if that type's runtime has started.
  RngStash(const std::vector<at::Tensor>& inputs, c10::DeviceType device_type);

  /// Forgets the CPU state when the generator has not moved since the stash: the forward drew no
  /// random numbers on the CPU, so the recompute has nothing to replay (and 5 KB less is kept).
  void drop_cpu_state_if_unused();

  /// Puts the stashed states back into the generators: the random stream starts again where the
  /// stash was taken (a forward run again).
  void restore() const;

  /// Whether restoring would write any generator: a CPU state not dropped, or a device's.
  bool holds_state() const { return cpu_state_.defined() || !device_states_.empty(); }
  c10::DeviceType device_type() const { return device_type_; }
  bool had_device_at_forward() const { return had_device_; }
  /// The stashed states (for reports of what a region keeps): the CPU's (undefined once
  /// dropped), and one per device generator, in the order of `device_generators()`.
  const at::Tensor& cpu_state() const { return cpu_state_; }
  const std::vector<at::Tensor>& device_states() const { return device_states_; }
  const std::vector<at::Generator>& device_generators() const { return device_generators_; }

 private:
  friend class RngFork;
  at::Tensor cpu_state_;
  c10::DeviceType device_type_;
  bool had_device_ = false;
  std::vector<at::Generator> device_generators_;
  std::vector<at::Tensor> device_states_;
};

/// For its lifetime, the generators hold the stashed states; afterwards they are put back as they
/// were, so a recompute leaves the caller's random stream untouched (Python's `fork_rng`).
class RngFork {
 public:
  explicit RngFork(const RngStash& stash);
  ~RngFork();
  RngFork(const RngFork&) = delete;
  RngFork& operator=(const RngFork&) = delete;

 private:
  at::Tensor saved_cpu_state_;
  std::vector<at::Generator> generators_;
  std::vector<at::Tensor> saved_device_states_;
};

/// Puts the generators of the CPU and of `device_type`'s devices among `tensors` back, on
/// destruction, as they were at construction: code that runs stages again (a chain's recomputes,
/// the profiler's repeated runs) leaves the caller's random streams where they were.
class RngRestore {
 public:
  RngRestore(const std::vector<at::Tensor>& tensors, c10::DeviceType device_type)
      : now_(tensors, device_type) {}
  ~RngRestore() { now_.restore(); }
  RngRestore(const RngRestore&) = delete;
  RngRestore& operator=(const RngRestore&) = delete;

 private:
  RngStash now_;  // one copy of each state (a CPU state is 5 KB, inside the step's peak)
};

}  // namespace detail
}  // namespace ckpt
