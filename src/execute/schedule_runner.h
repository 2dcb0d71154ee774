#pragma once

// Runs one forward/backward of a chain under a schedule: the state between the two passes, kept
// by the autograd node that stands for the chain in the graph.

#include <ckpt/execute/planned_sequential_impl.h>
#include <ckpt/plan/schedule.h>

#include "chains/stage_graph.h"
#include "region/autocast_state.h"
#include "region/rng_state.h"
#include "region/training_modes.h"
#include "region/version_snapshot.h"

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>
#include <torch/nn/modules/container/any.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ckpt {
namespace detail {

/// How stage i runs `forward_all` with storage option k: `of_stage[i][k]` holds the options of
/// the checkpointed region it runs as, or nothing for the plain stage (option 0).
struct StorageRegions {
  std::vector<std::vector<std::optional<CheckpointOptions>>> of_stage;
};

/// The regions of every storage option of `profile`, from their names ("checkpointed",
/// "selective"); an option with another name is an error.
StorageRegions storage_regions(const plan::Chain& profile, const SelectivePolicy& selective);

class ScheduleRunner {
 public:
  ScheduleRunner(std::vector<torch::nn::AnyModule> stages, plan::Schedule schedule,
                 std::shared_ptr<const StorageRegions> regions, bool preserve_rng_state,
                 std::shared_ptr<ExecutionObserver> observer);

  /// Runs the operations before the loss and returns the chain's output (x_L).
  at::Tensor forward(const at::Tensor& input);
  /// Runs the operations after the loss from δ_L; returns δ_0 (undefined if the input needs no
  /// grad). With `leaves` (a plain backward), the gradients of parameters are added to it;
  /// without, only the input's gradient is computed (as in `StageGraph::backward`).
  at::Tensor backward(at::Tensor grad_output, LeafGradients* leaves);

 private:
  void run_forward(const plan::Op& op);
  void run_stage(const plan::Op& op, const at::Tensor& input);
  void run_backward(const plan::Op& op, LeafGradients* leaves);
  const at::Tensor& available(int i) const;
  void snapshot_read_again(const at::Tensor& input);
  std::string describe_read_again(size_t i) const;

  std::vector<torch::nn::AnyModule> stages_;
  plan::Schedule schedule_;
  std::shared_ptr<const StorageRegions> regions_;
  size_t loss_index_;
  bool preserve_rng_state_;
  std::shared_ptr<ExecutionObserver> observer_;

  bool input_requires_grad_ = false;
  std::vector<at::Tensor> x_;                      // standalone x_i, i = 0..L
  std::vector<bool> kept_;                         // x_i is a checkpoint
  std::vector<c10::optional<StageGraph>> graphs_;  // graphs_[i] holds x̄_{i+1}
  std::vector<c10::optional<RngStash>> rng_;       // RNG before stage i first ran
  std::vector<AutocastState> autocast_;            // autocast when stage i first ran
  std::vector<TrainingModes> training_;            // train()/eval() when stage i first ran
  std::vector<bool> ran_;
  std::vector<bool> recomputed_;  // stage i runs more than once
  at::Tensor delta_;              // the gradient at the current position
  // x_0 and the parameters of the stages that run again, after the forward; (stage, parameter
  // number) of each, stage -1 for x_0.
  VersionSnapshot read_again_;
  std::vector<std::pair<int, size_t>> read_again_origin_;
};

}  // namespace detail
}  // namespace ckpt
