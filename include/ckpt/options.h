#pragma once

#include <ckpt/selective.h>

#include <c10/core/DeviceType.h>
#include <torch/arg.h>

#include <functional>
#include <memory>
#include <optional>

namespace ckpt {

/// A context of your own that a region holds while its forward or one of its recomputes runs:
/// any RAII object (a guard, a timer, a profiler range), type-erased.
using RegionContext = std::shared_ptr<void>;

/// The two contexts of one region, as PyTorch's `context_fn` returns them: `forward` is called to
/// enter a context around the region's forward, `recompute` around each of its recomputes
/// (inside the replayed RNG, autocast and train()/eval() state, with `ckpt::is_recomputing()`
/// true). Either may be empty.
struct RegionContexts {
  std::function<RegionContext()> forward;
  std::function<RegionContext()> recompute;
};

/// How offloading moves data: options of `ckpt::OffloadGuard` and of offloaded regions
/// (`CheckpointOptions::offload_options`). The defaults suit a training step; docs/offloading.md
/// says when to change them.
struct OffloadOptions {
  /// Host copies of CUDA data go to pinned (page-locked) memory, which the copies need to run
  /// asynchronously; where pinned memory can't be had, pageable memory, with one warning. Other
  /// devices get pageable memory. Host buffers are kept in a pool for the next step's copies.
  /// Default: true
  TORCH_ARG(bool, pin_memory) = true;
  /// Scopes (guards, offloaded regions) brought back ahead: once the backward has begun using a
  /// scope's data, the data of the `look_ahead` scopes offloaded just before it on the same thread
  /// comes back too, behind its own and in the order their backwards read it, so that its copies
  /// run during this scope's backward instead of in front of their own. 0: each scope's data
  /// comes back at its own first use. Default: 1
  TORCH_ARG(int, look_ahead) = 1;
  /// Device bytes the look-ahead may hold beyond what the running backward has let go of. At 0
  /// it brings data back only into room the backward freed, one release behind (the backward's
  /// next temporaries often take the room just freed), so that the step peaks no higher than
  /// without it; more lets the copies start earlier, at that much more memory. -1: whole scopes
  /// at once, as soon as the backward reaches the scope before. Default: 0
  TORCH_ARG(int64_t, max_ahead_bytes) = 0;
  /// The scope keeps its device data (and its copy in host memory) while it is among the
  /// `keep_last` newest scopes of its thread: the last scopes of a forward are the first of the
  /// backward, whose copies back nothing could hide. Costs device memory at the forward's end.
  /// Default: 0
  TORCH_ARG(int, keep_last) = 0;
  /// Data smaller than this many bytes stays on the device: a copy costs a fixed overhead, and
  /// small tensors (a normalisation's statistics) free little. Default: 0
  TORCH_ARG(int64_t, min_bytes) = 0;
};

/// Options for `ckpt::checkpoint` and `ckpt::checkpoint_sequential`.
///
/// Mirrors the keyword arguments of Python's `torch.utils.checkpoint.checkpoint`; see
/// https://pytorch.org/docs/stable/checkpoint.html for the exact semantics.
///
/// Example:
/// ```
/// auto y = ckpt::checkpoint(ckpt::CheckpointOptions().use_reentrant(true), block, x);
/// ```
struct CheckpointOptions {
  /// Use the reentrant algorithm of the original PyTorch documentation: the forward runs under
  /// no-grad and the backward recomputes and runs a nested backward. It does not work with
  /// `torch::autograd::grad`, needs an input that requires grad, and gives no double backward.
  /// Default: false (the non-reentrant algorithm, which has none of these limits).
  TORCH_ARG(bool, use_reentrant) = false;
  /// Stash the CPU RNG state and that of the device type of the tensor arguments at forward time
  /// and replay it during the recompute, so that dropout draws the same masks. Default: true
  TORCH_ARG(bool, preserve_rng_state) = true;
  /// Check that the recompute produces outputs of the same shapes, dtypes and devices as the
  /// forward, and raise an error naming the first difference otherwise. Default: true
  TORCH_ARG(bool, determinism_check) = true;
  /// Selective checkpointing: which operators' outputs the region keeps from the forward instead
  /// of recomputing them (see `SelectivePolicy`, `save_matmuls()`, `save_ops()`). Non-reentrant
  /// variant only. Default: none (recompute everything)
  TORCH_ARG(SelectivePolicy, policy);
  /// Record the operators the forward and the recompute run (below autograd) and raise an error
  /// that shows both sequences, aligned at their first difference, when they differ, as
  /// PyTorch's `debug=True` does. Costs a name per operator. Default: false
  TORCH_ARG(bool, debug) = false;
  /// Check the recompute by value: the forward records a checksum of every operator's outputs
  /// (their bytes, so the check is exact), and the recompute compares each operator's as it runs;
  /// the first that differs raises an error naming the operator, its position in the region, its
  /// output's shape and both checksums, and what can cause it (a nondeterministic kernel, state
  /// outside the region changed before the backward, a random draw from a generator the region
  /// does not replay). Operators whose outputs hold no values of their own (`empty`, views) are
  /// skipped. Costs a pass over every output (and its copy to the host on an accelerator) in the
  /// forward and in the recompute, and runs the recompute in full (no early stop); off, it costs
  /// nothing. `set_checkpoint_check_values` overrides it. Default: false
  TORCH_ARG(bool, check_values) = false;
  /// With `check_values`: checksum only the outputs of these operators ("aten::mm" for every
  /// overload, "aten::add.Tensor" for one), a sample that costs a pass over their outputs alone;
  /// every other operator is still checked for its place, shapes and dtypes. Empty: every
  /// operator's outputs. Default: empty
  TORCH_ARG(std::vector<std::string>, check_values_ops);
  /// Called once per region when its forward starts (PyTorch's `context_fn`): the contexts the
  /// forward and the recomputes run in. Composes with `policy`. An exception it, or a context,
  /// throws propagates with grad mode, RNG, autocast and buffers as they were. Default: none
  TORCH_ARG(std::function<RegionContexts()>, context_fn);
  /// Early stop: the recompute runs the kernels of only those operators whose outputs the
  /// backward reads, learned at each call site from its first full recompute; the others build
  /// their autograd nodes but compute nothing. Random and in-place operators always run, so RNG
  /// and buffers end as after a full recompute. Off by default, because it is sound only for a
  /// function that (1) reaches every tensor's data through the dispatcher (no `data_ptr` loops,
  /// no reads of a skipped output's values in C++), (2) gives outputs whose shapes follow from its
  /// arguments' shapes and non-tensor values (not `masked_select`, `nonzero` or boolean
  /// indexing), and (3) is the same function at every call of its call site (not a helper that
  /// checkpoints whichever `std::function` it is given). Where those hold, it saves the skipped
  /// kernels' time; elsewhere it gives wrong gradients or errors (docs/mechanism.md). Non-reentrant
  /// variant only. `set_checkpoint_early_stop` overrides it. Default: false
  TORCH_ARG(bool, early_stop) = false;
  /// The backward's recompute in two passes, for a lower peak: the first keeps only what the
  /// function's last operators save for the backward (where to cut is estimated from the sizes
  /// the call site's last recompute saved); the first time the
  /// backward reads what an earlier operator saved, the function runs again, from the same
  /// arguments and random state, until it has saved those, and stops there (by an exception
  /// thrown through it, as PyTorch's early stop does). So the backward never holds both halves:
  /// an attention block's backward peaks in its softmax, while its projections' inputs wait for
  /// their own backward. Costs up to one more forward of the region. Gradients are those of one
  /// pass, to the bit; a function that saves other tensors the second time (by shape, dtype or
  /// device) is an error. Not for a function that must run to its end once started (state set
  /// and reset without RAII). Non-reentrant variant without a `policy` only; a region whose
  /// graph is kept (`GraphExecGroup`) or differentiated again, that a planner let drop an
  /// argument, or in a process running Python's autograd engine recomputes in one pass;
  /// `early_stop` has no effect on it. Default: false
  TORCH_ARG(bool, two_pass_recompute) = false;
  /// Offloading instead of checkpointing: the region runs once, and what autograd saves for its
  /// backward goes to host memory during its forward and comes back, ahead of use, when its
  /// backward starts, as inside a `ckpt::OffloadGuard` (see there for what moves and how). Nothing
  /// is recomputed, so the RNG, early-stop and determinism options have no effect. Its arguments
  /// and results stay on the device (whoever passed them holds them, and what comes next reads
  /// them): what moves is what it computes inside. Not with
  /// `use_reentrant(true)` or a `policy` (whose `MustOffload` offloads operator by operator).
  /// The region's tensor arguments must be on an accelerator: host data has nowhere to go, and
  /// the region raises an error rather than copying host memory to host memory. Default: false
  TORCH_ARG(bool, offload) = false;
  /// How an offloaded region (`offload(true)`) moves its data. Default: `OffloadOptions()`
  TORCH_ARG(OffloadOptions, offload_options);
};

/// Overrides the `debug` option of every region whose forward starts from now on, in the whole
/// process (PyTorch's `set_checkpoint_debug_enabled`): true or false for every region,
/// std::nullopt for each region's own option (the default).
void set_checkpoint_debug_enabled(std::optional<bool> enabled);
/// The process-wide override of `debug`; std::nullopt when there is none.
std::optional<bool> checkpoint_debug_enabled();

/// Sets the process-wide `debug` override for its lifetime, and puts the previous one back.
///
/// Example:
/// ```
/// { ckpt::CheckpointDebugGuard debug(true); /* every region records its operators here */ }
/// ```
class CheckpointDebugGuard {
 public:
  explicit CheckpointDebugGuard(std::optional<bool> enabled);
  ~CheckpointDebugGuard();
  CheckpointDebugGuard(const CheckpointDebugGuard&) = delete;
  CheckpointDebugGuard& operator=(const CheckpointDebugGuard&) = delete;

 private:
  std::optional<bool> previous_;
};

/// Overrides the `check_values` option of every region whose forward starts from now on, in the
/// whole process: true or false for every region, std::nullopt for each region's own option (the
/// default).
///
/// Example:
/// ```
/// ckpt::set_checkpoint_check_values(true);  // every region checks its recompute by value
/// ```
void set_checkpoint_check_values(std::optional<bool> enabled);
/// The process-wide override of `check_values`; std::nullopt when there is none.
std::optional<bool> checkpoint_check_values();

/// Overrides the `early_stop` option of every region whose recompute starts from now on, in the
/// whole process (PyTorch's `set_checkpoint_early_stop`): true or false for every region,
/// std::nullopt for each region's own option (the default).
void set_checkpoint_early_stop(std::optional<bool> enabled);
/// The process-wide override of `early_stop`; std::nullopt when there is none.
std::optional<bool> checkpoint_early_stop();

/// Sets the process-wide `early_stop` override for its lifetime, and puts the previous one back.
///
/// Example:
/// ```
/// { ckpt::CheckpointEarlyStopGuard full(false); /* every recompute here runs in full */ }
/// ```
class CheckpointEarlyStopGuard {
 public:
  explicit CheckpointEarlyStopGuard(std::optional<bool> enabled);
  ~CheckpointEarlyStopGuard();
  CheckpointEarlyStopGuard(const CheckpointEarlyStopGuard&) = delete;
  CheckpointEarlyStopGuard& operator=(const CheckpointEarlyStopGuard&) = delete;

 private:
  std::optional<bool> previous_;
};

/// The device type whose RNG and autocast state a region preserves when its tensor arguments sit
/// on no device other than the CPU, as `torch.utils.checkpoint.DefaultDeviceType` does in
/// PyTorch's newest Python.
///
/// Among the tensor arguments, CUDA is preferred when several non-CPU device types are present
/// (with a warning), otherwise the single non-CPU device type found is used.
struct DefaultDeviceType {
  /// Sets the fallback device type. Default: LibTorch's current accelerator when one is
  /// available at run time (`at::getAccelerator()`: CUDA on a machine with a GPU, a registered
  /// PrivateUse1 backend before it), else the CPU.
  static void set_device_type(c10::DeviceType type);
  /// Returns the fallback device type.
  static c10::DeviceType get_device_type();
};

}  // namespace ckpt
