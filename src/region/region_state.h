#pragma once

// What a checkpointed region keeps between its forward and its backward pass.

#include <ckpt/detail/region.h>

#include "autograd/autocast_state.h"
#include "autograd/buffer_guard.h"
#include "autograd/graph.h"
#include "autograd/outside_state.h"
#include "autograd/recompute_scope.h"
#include "autograd/rng_state.h"
#include "autograd/saved_tensor_hooks.h"
#include "autograd/training_modes.h"
#include "autograd/version_snapshot.h"
#include "graph_exec_group.h"
#include "input_copies.h"
#include "recomputed_input.h"
#include "selective.h"
#include "value_check.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Optional.h>
#include <c10/util/intrusive_ptr.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ckpt {
namespace detail {

/// Shape, dtype and device of one output tensor, for the determinism check.
struct TensorMeta {
  bool defined = false;
  std::vector<int64_t> sizes;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  c10::Device device = c10::Device(c10::DeviceType::CPU);

  static TensorMeta of(const at::Tensor& tensor);
  bool operator==(const TensorMeta& other) const;
};

struct RegionState {
  CheckpointOptions options;
  std::vector<at::Tensor> inputs;  // the tensor arguments, in traversal order
  InputCopies input_copies;        // of those the function writes into, before it ran
  // Those a planner let the region drop (`RegionRequest`), by argument; empty where none. The
  // recompute computes them again from their sources.
  std::vector<DroppedInput> dropped;
  ModuleList modules;                   // whose buffers the recompute must leave as they were
  TrainingModes training;               // their train()/eval() modes in the forward
  BuffersAtForward buffers_at_forward;  // their buffers the forward wrote, as it found them
  // Tensors out of the region's sight that the forward wrote and read again, as it found them.
  OutsideState outside_at_forward;
  std::optional<RandomDraws> forward_draws;  // what the forward's function drew from
  // The inputs (at the start of the forward), then the leaves at the region's border that the
  // recomputation reads again: parameters, captured or owned by modules (at its end).
  VersionSnapshot versions;
  // Tensors from outside that the forward's operators read (`OutsideStateWatch::take_reads`): a
  // recompute reads them again, as the forward's versions.
  ReadVersions outside_reads;
  c10::optional<RngStash> rng;         // empty without preserve_rng_state
  bool rng_forward_end_noted = false;  // `rng` noted where this run of the forward ended
  AutocastState autocast;
  // Autocast's cast cache is off while the region's forward runs: from the Region's construction
  // to its destruction (see AutocastCacheOff).
  c10::optional<AutocastCacheOff> cast_cache_off;
  std::vector<TensorMeta> outputs;  // every output tensor of the forward, in traversal order
  std::vector<size_t> connected;    // which outputs feed the backward node, by its input number
  RecomputeFn recompute;
  std::shared_ptr<CallSite> site;    // where the region was made: what early stop learned there
  uint64_t learned_moment = 0;       // when its forward began (`learning_moment`)
  bool keeps_forward_graph = false;  // a forward run again keeping its graph
  bool forward_graph_whole = true;   // the forward let go of none of its graph's saved tensors
  bool recompute_twice = false;      // the backward recomputes in two passes (two_pass_recompute)
  std::weak_ptr<GroupState> forward_group;  // the GraphExecGroup current when the forward ran
  // From `context_fn`: what each recompute runs in (empty without).
  std::function<RegionContext()> recompute_context;
  // The region's memory label ("region N" under the caller's); its recompute runs under
  // "<it>/recompute".
  std::shared_ptr<LabelNode> memory_label;
  std::unique_ptr<KeptOutputs> kept;          // with a selective policy: what the forward kept
  std::vector<std::string> forward_ops;       // with debug: the operators the forward ran
  std::vector<OutputSums> forward_values;     // with check_values: its operators' output checksums
  std::vector<uint64_t> forward_output_sums;  // with check_values: its outputs' checksums
  bool released = false;
  bool arguments_let_go = false;  // by the last backward, once its recompute ran
  // Separate backward passes through different outputs (one loss each): which connected outputs
  // had theirs without retain_graph, those of the engine's current call, and the outputs handed
  // to the caller, held weakly to tell when the others are gone.
  std::vector<bool> served;
  std::vector<size_t> serving;
  bool in_engine_call = false;
  std::vector<c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>> handed_out;

  /// Raises an error when an input, a parameter or (where a recompute is to read them again:
  /// `recomputes`) a captured tensor the region reads was modified in place since the forward.
  void check_unmodified(bool recomputes = true) const;
  /// Raises an error when the recomputed outputs differ from the forward's (see
  /// `CheckpointOptions::determinism_check`).
  void check_recomputed(const std::vector<at::Tensor>& recomputed) const;
  /// Raises an error when the recomputation built another autograd graph than the forward pass
  /// (with the determinism check on).
  void check_same_graph(const GraphShape& forward, const GraphShape& recomputed) const;
  /// With check_values, where the recompute's operators parted from the forward's: raises an
  /// error when the recomputed outputs' values differ from the forward's.
  void check_same_values(const std::vector<at::Tensor>& recomputed,
                         const std::string& parted) const;
  /// Runs the recompute with the forward's RNG and autocast state and grad mode on, and puts the
  /// modules' buffers back as they were. `early_stop`, when given, is the outermost mode around
  /// the function (it sees only the calls that reach the kernels). `saving`, when given, makes
  /// the hooks of the tensors the recomputed graph saves (none otherwise: the graph is the
  /// backward's own, and an OffloadGuard around the backward leaves it).
  std::vector<at::Tensor> run_recompute(const std::vector<at::Tensor>* replacement,
                                        DispatchMode* early_stop = nullptr,
                                        const SavedHooksFactory& saving = nullptr) const;
  /// The outputs' values as the forward computed them, without history: the function run again
  /// under no-grad, as `run_recompute` runs it (what a `RecomputeSource` hands out).
  std::vector<at::Tensor> recompute_values() const;
  /// Inside a recompute, after the function ran: an error where it drew other random numbers
  /// than the forward (another thread drew from the same generator meanwhile).
  void check_random_draws(const RecomputeScope& scope, const OutsideStateWatch& recompute) const;
  /// The arguments for a recompute: the held ones, the copies of those the function writes into,
  /// and the dropped ones computed again (with their gradient edges where `with_history`).
  std::vector<at::Tensor> arguments(bool with_history) const;
  /// Records the outputs handed to the caller (connected to the region's node, in slot order).
  void hand_out(const std::vector<at::Tensor>& outputs);
  /// At the start of the node's backward: raises the error for a backward through a region whose
  /// state was freed, or through an output whose backward already ran, and notes the outputs that
  /// have a gradient in this one.
  void begin_backward(const std::vector<at::Tensor>& grads);
  /// The node's `release_variables`. After the engine's call (without retain_graph) the outputs of
  /// that backward are done; the state is freed once every output is done or gone. Called from
  /// elsewhere (an enclosing forward letting go of its graph), it frees the state at once.
  void end_backward();
  void release();
  /// Whether the backward just begun is the region's last: the engine keeps no graph and makes
  /// none, no group (`in_group`) serves a later one, and by its end every output has had its
  /// backward or is gone, so that `end_backward` releases the state.
  bool backward_is_last(bool in_group) const;
  /// In the last backward, once its recompute ran: lets go of the arguments. The recomputed graph
  /// holds what it saved of them; the rest (an argument only concatenated or added, as a U-Net
  /// decoder's skip) is freed now rather than when the backward ends.
  void let_go_of_arguments();
};

}  // namespace detail
}  // namespace ckpt
