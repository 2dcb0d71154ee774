#pragma once

// The chain model of the planner: per-stage costs of a sequential network.
// See docs/memory-model.md for how these numbers enter the simulator and the solvers.

#include <cstdint>
#include <string>
#include <vector>

namespace ckpt {
namespace plan {

/// One way of running a stage with full storage (`forward_all`): its costs and what it keeps.
///
/// A stage always has option 0, made of its own fields. `Stage::alternatives` adds options
/// 1, 2, ... (Rockmate style: e.g. "keep everything" vs "keep only the matmul outputs").
struct StorageOption {
  /// Time of the grad-enabled forward of the stage in this mode (its compute only, for an
  /// offload option: Chain::forward_all_time adds the copies).
  double forward_time = 0.0;
  /// Time of the backward of the stage after a forward in this mode (compute only, as above).
  double backward_time = 0.0;
  /// Bytes kept on the device for the backward after the forward (|x̄_{i+1}|, the stage's output
  /// included).
  int64_t saved_bytes = 0;
  /// Transient bytes above the saved ones during the forward.
  int64_t forward_tmp_bytes = 0;
  /// Transient bytes during the backward, above its inputs, the saved bytes and its output.
  int64_t backward_tmp_bytes = 0;
  /// How an executor runs the stage in this mode: the name of a storage mode
  /// (`ckpt::StorageModes`), such as "checkpointed" (a checkpointed region: keeps its output,
  /// recomputes everything in the backward) or "selective" (a region under a selective policy:
  /// keeps its output and what the policy saves, recomputes the rest). The solvers and the
  /// simulator ignore it.
  std::string name;
  /// Bytes this option keeps in host memory for the backward (docs/memory-model.md,
  /// "Offloading"): copied out during the forward, back at the start of the backward (which
  /// counts them in backward_tmp_bytes). > 0 makes it an offload option. Default: 0
  int64_t offloaded_bytes = 0;
};

/// Measured costs of stage i, which maps x_i to x_{i+1}. The field names are the JSON ones of
/// `ckpt plan --chain FILE.json`.
struct Stage {
  /// Time of one forward of the stage (used by every forward mode unless `forward_all_time` or
  /// an alternative says otherwise for `forward_all`).
  double forward_time = 0.0;
  /// Time of the backward of the stage.
  double backward_time = 0.0;
  /// Size of the stage's output x_{i+1} (the next stage's input; δ_{i+1} has the same size).
  int64_t output_bytes = 0;
  /// Size of everything kept for the backward after a grad-enabled forward (|x̄_{i+1}|), output
  /// included, so `saved_bytes >= output_bytes`.
  int64_t saved_bytes = 0;
  /// Transient bytes during a forward, above what the forward keeps (the no-grad forwards; also
  /// `forward_all` unless `forward_all_tmp_bytes` says otherwise).
  int64_t forward_tmp_bytes = 0;
  /// Transient bytes during the backward.
  int64_t backward_tmp_bytes = 0;
  /// Extra full-storage options 1..K (option 0 is always made of the fields above). The
  /// no-grad forwards (`forward_none`, `forward_input`) always use `forward_time` and
  /// `forward_tmp_bytes`. Default: empty (one option).
  std::vector<StorageOption> alternatives;
  /// Transient bytes of the grad-enabled forward of option 0, when they differ from the no-grad
  /// forward's (what a no-grad forward frees, such as attention scores, a grad-enabled one may
  /// keep, and then it is in `saved_bytes`). -1: the same as `forward_tmp_bytes`. Default: -1
  int64_t forward_all_tmp_bytes = -1;
  /// Time of the grad-enabled forward of option 0, when it differs from the no-grad forwards'
  /// (`forward_time`, which `forward_none` and `forward_input` take): a grad-enabled forward
  /// also builds the autograd graph. -1: the same as `forward_time`. Default: -1
  double forward_all_time = -1.0;
  /// Bytes of the parameter gradients the stage's backward creates: its parameters' `.grad`,
  /// where the step starts without them (`zero_grad()` sets them to none). They stay until the
  /// step ends. A parameter shared by several stages counts in the last of them, whose backward
  /// runs first. 0 where the gradients exist before the step. Default: 0
  int64_t gradient_bytes = 0;
  /// Bytes of random-number state the executor keeps for the stage from its first forward to
  /// the step's end when the schedule runs it more than once, so that its recomputes draw what
  /// its forward drew: the chain's `random_state_bytes` where the stage draws random numbers on
  /// the counted memory's side (dropout on the CPU), else 0. Default: 0
  int64_t random_state_bytes = 0;
  /// Bytes of the stage's buffers (BatchNorm's running statistics), which the executor copies
  /// during each forward of the stage after its first and writes back afterwards, so that a
  /// recompute leaves them as the forward did: a transient of those forwards. Default: 0
  int64_t buffer_bytes = 0;
  /// Bytes of the copies of the stage's buffers that the executor keeps from the stage's first
  /// forward to its backward when the schedule runs it more than once, so that a recompute starts
  /// from the values its forward read (a module that updates a buffer and then reads it): those
  /// the forward writes into (BatchNorm's running statistics in training) and those the stage
  /// shares with another stage, which may write them later. At most `buffer_bytes`. Default: 0
  int64_t kept_buffer_bytes = 0;

  /// Number of full-storage options: 1 + alternatives.size().
  int option_count() const { return 1 + static_cast<int>(alternatives.size()); }
  /// Full-storage option k (0 = the stage's own fields). Throws std::invalid_argument when k is
  /// out of range.
  StorageOption option(int k) const;
};

/// A chain of stages F_0 ... F_{L-1} followed by a loss. x_0 is the chain's input.
struct Chain {
  /// Size of the chain's input x_0 (held by the caller for the whole step).
  int64_t input_bytes = 0;
  /// The stages, in execution order.
  std::vector<Stage> stages;
  /// Bytes copied between host and device per unit of the chain's time (the unit of
  /// forward_time; the profiler's is seconds). 0: copies take no time. Default: 0
  double host_bandwidth = 0.0;
  /// Bytes of one copy of the random-number state the executor reads where the counted memory
  /// holds it (the CPU generator's state, 5 KB, for a chain on the CPU; 0 on an accelerator,
  /// whose states live in host memory): the stash of a stage that runs again, taken during its
  /// first forward; the caller's state, put aside during each recompute of a stage that draws
  /// random numbers and kept through a backward that runs one. See docs/memory-model.md.
  /// Default: 0
  int64_t random_state_bytes = 0;

  /// Number of stages L (the loss is not a stage here).
  int size() const { return static_cast<int>(stages.size()); }
  /// The most the executor's own state adds to any schedule's peak: every stage's stash and kept
  /// buffer copies, and the larger of what a first forward holds (a read of the random state and
  /// a second one after it, or the buffers' copies) and what a later forward does (the caller's
  /// state, kept through a backward that replays a stash, and the one put aside around the
  /// forward; the largest stage's buffers, copied). The solvers' programs leave it out and keep it
  /// free.
  int64_t executor_state_reserve() const;
  /// |x_i| for i in [0, L]: input_bytes for i = 0, stages[i-1].output_bytes otherwise.
  int64_t activation_bytes(int i) const;
  /// The time of copying `bytes` one way between host and device: bytes / host_bandwidth (0 when
  /// host_bandwidth is 0).
  double copy_time(int64_t bytes) const;
  /// The time of Fall with `option`: max(forward_time, offloaded_bytes / host_bandwidth), since
  /// the copies run on a side stream beside the compute (0 copy time when host_bandwidth is 0).
  /// The simulator and every solver charge this.
  double forward_all_time(const StorageOption& option) const;
  /// The time of B with `option`: max(backward_time, offloaded_bytes / host_bandwidth).
  double backward_time(const StorageOption& option) const;
  /// The sum over stages of each stage's largest offloaded_bytes: no persistent schedule holds
  /// more host memory at once, so a host budget of at least this cannot bind. For a valid chain
  /// (validate() bounds the sum).
  int64_t max_host_bytes() const;
  /// Limits of validate(): the sum of every size in the chain and the sum of every time. They
  /// keep the planner's arithmetic exact: sums of sizes alive together never overflow int64 and
  /// a schedule's time is never infinite.
  static constexpr int64_t kMaxTotalBytes = int64_t{1} << 60;  // 1 EiB
  static constexpr double kMaxTotalTime = 1e200;

  /// Throws std::invalid_argument (message prefixed "ckpt::plan::Chain::validate") when the
  /// chain is empty, a time is negative or not finite, a size is negative, a saved_bytes is
  /// smaller than the stage's output_bytes, host_bandwidth is negative or not finite, or the
  /// totals (offloaded_bytes included) exceed kMaxTotalBytes or kMaxTotalTime.
  void validate() const;
};

/// `chain` with every time (forward, grad-enabled forward, backward, of every option) multiplied
/// by `factor` (> 0) and host_bandwidth divided by it. Plans do not change: a schedule's time
/// scales by the same factor.
Chain scale_times(Chain chain, double factor);

/// A chain of `stages` identical stages (all times and sizes equal, no temporaries); x_0 has
/// `activation_bytes` too. Convenient for tests, benchmarks and the Revolve comparison.
Chain homogeneous_chain(int stages, double forward_time, double backward_time,
                        int64_t activation_bytes, int64_t saved_bytes);

}  // namespace plan
}  // namespace ckpt
