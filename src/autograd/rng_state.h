#pragma once

// Stashing the RNG state at forward time and replaying it during the recompute.

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/DeviceType.h>

#include <algorithm>
#include <optional>
#include <vector>

namespace ckpt {
namespace detail {

/// Whether two generator states (byte tensors from `Generator::get_state`) are identical.
bool same_state(const at::Tensor& a, const at::Tensor& b);

/// Bytes of one copy of the CPU generator's state (5056 with LibTorch 2.x).
int64_t cpu_random_state_bytes();

/// The device type whose RNG is preserved for these tensor arguments (DefaultDeviceType rules).
c10::DeviceType infer_device_type(const std::vector<at::Tensor>& tensors);

/// Which default generators a function drew from, as a dispatch mode saw its random operators
/// (those given a generator of their own don't count).
struct RandomDraws {
  /// Where each draw began and ended: hashes of its generator's state before and after it.
  std::vector<size_t> states;
  std::vector<c10::Device> devices;  // each draw's generator's

  bool drew_on_cpu() const {
    return std::any_of(devices.begin(), devices.end(), [](c10::Device d) { return d.is_cpu(); });
  }
  bool drew_on_device() const {  // a generator of an accelerator
    return std::any_of(devices.begin(), devices.end(), [](c10::Device d) { return !d.is_cpu(); });
  }
  /// Whether two runs drew from the same generators in the same order (where: `states`).
  bool same_generators(const RandomDraws& other) const { return devices == other.devices; }
};

/// A hash of `generator`'s state (a CPU generator's read without allocating).
size_t generator_state_hash(at::Generator generator);

/// The RNG states of the CPU and of the devices of one accelerator type among a region's arguments
/// (any type this LibTorch has hooks for: CUDA, XPU, MPS, PrivateUse1, ...).
class RngStash {
 public:
  /// Reads the current states: the CPU's, and those of `device_type`'s devices that `inputs` use,
  /// if that type's runtime has started.
  RngStash(const std::vector<at::Tensor>& inputs, c10::DeviceType device_type);

  /// Where the forward ends. Forgets the CPU state when the generator has not moved since the
  /// stash: the forward drew no random numbers on the CPU, so the recompute has nothing to replay
  /// (and 5 KB less is kept); where another thread wrote a state into it meanwhile, only if
  /// `draws` (what a dispatch mode saw the function draw from, where one watched) has none there.
  /// Notes where each generator stands (a hash of its state) and whether another thread wrote
  /// into it meanwhile, for the checks below.
  void note_forward_end(const std::optional<RandomDraws>& draws = std::nullopt);

  /// Whether another thread wrote a stashed state into a generator (replayed it, to recompute a
  /// region of its own) while this forward ran and drew from it: the forward's draws may have
  /// come from that replay, which no recompute can repeat. `draws`: what a dispatch mode saw the
  /// function draw from, where one watched (else only the generators' moves tell).
  bool forward_beside_replay(const std::optional<RandomDraws>& draws) const;

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
  // Per generator, the CPU's first: how it stood when the forward ended.
  struct ForwardEnd {
    uint64_t replays_at_stash = 0;  // other threads' writes into it, when stashed
    size_t state_hash = 0;          // its state where the forward ended, where it moved
    bool moved = false;             // from the stash to the forward's end
    bool beside_replay = false;     // another thread wrote into it meanwhile
    // Whether the forward drew from it: as a dispatch mode saw (`draws`, where one watched), else
    // whether it moved (another thread's draws move it too).
    bool fed(const std::optional<RandomDraws>& draws, bool cpu) const;
  };
  ForwardEnd cpu_end_;
  std::vector<ForwardEnd> device_ends_;
  bool forward_ended_ = false;
};

/// For its lifetime, the generators hold the stashed states; afterwards they are put back as they
/// were, so a recompute leaves the caller's random stream untouched (Python's `fork_rng`).
class RngFork {
 public:
  explicit RngFork(const RngStash& stash);
  ~RngFork();
  RngFork(const RngFork&) = delete;
  RngFork& operator=(const RngFork&) = delete;

  /// After the recompute ran inside the fork: an error naming `who` (ending with `skip_hint`, how
  /// to turn the check off) where it drew other numbers than the forward: a generator stands
  /// elsewhere than the forward left it, or another thread wrote into one the forward drew from
  /// while the recompute ran. `forward_draws` as for `RngStash::forward_beside_replay`: where a
  /// dispatch mode saw no draw from a generator, one standing where the stash was (a recompute
  /// that drew nothing from it) passes too. Where both runs were watched and drew from other
  /// generators, the function ran differently: no error here (the graphs' comparison says how).
  void check_drew_as_forward(const std::optional<RandomDraws>& forward_draws,
                             const std::optional<RandomDraws>& recompute_draws, const char* who,
                             const char* skip_hint) const;

 private:
  const RngStash& stash_;
  std::vector<uint64_t> replays_at_fork_;  // other threads' writes, the CPU's first
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
