#pragma once

// Runs one forward/backward of a chain under a schedule: the state between the two passes, kept
// by the autograd node that stands for the chain in the graph.

#include <ckpt/plan/schedule.h>
#include <ckpt/planned_sequential.h>
#include <ckpt/report.h>
#include <ckpt/storage_mode.h>

#include "autograd/autocast_state.h"
#include "autograd/buffer_guard.h"
#include "autograd/host_offload.h"
#include "autograd/rng_state.h"
#include "autograd/stage_graph.h"
#include "autograd/training_modes.h"
#include "autograd/version_snapshot.h"

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>
#include <torch/nn/modules/container/any.h>

#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

namespace ckpt {
namespace detail {

/// How each stage runs `forward_all` in each of its storage options.
struct OptionForwards {
  /// Stage i's forward in storage option k: in the option's storage mode, plainly for option 0.
  const StageForward& of(int i, int k) const {
    return by_stage.at(static_cast<size_t>(i)).at(static_cast<size_t>(k));
  }
  std::vector<std::vector<StageForward>> by_stage;
  /// The storage mode of stage i's option k (k > 0), for reports: names[i][k - 1].
  std::vector<std::vector<std::string>> names;
};

/// The forwards of every storage option of `stages` in `profile`, from the storage mode each
/// option names (`ckpt::StorageModes`); an option that names no mode of `modes`, or a mode the
/// settings turn off, is an error.
OptionForwards option_forwards(const std::vector<torch::nn::AnyModule>& stages,
                               const plan::Chain& profile, const StorageModes& modes,
                               const StorageSettings& settings);

class ScheduleRunner {
 public:
  ScheduleRunner(std::vector<torch::nn::AnyModule> stages, plan::Schedule schedule,
                 std::shared_ptr<const OptionForwards> option_forwards, bool preserve_rng_state,
                 std::shared_ptr<ExecutionObserver> observer);

  /// Runs the operations before the loss and returns the chain's output (x_L).
  at::Tensor forward(const at::Tensor& input);
  /// Runs the operations after the loss from δ_L; returns δ_0 (undefined if the input needs no
  /// grad). With `leaves` (a plain backward), the gradients of parameters are added to it;
  /// without, only the input's gradient is computed (as in `StageGraph::input_gradient`).
  at::Tensor backward(at::Tensor grad_output, LeafGradients* leaves);
  /// The parameters exactly one stage uses (see `LeafGradients`).
  const std::unordered_set<const c10::TensorImpl*>& single_stage_leaves() const {
    return single_stage_leaves_;
  }

 private:
  void run_forward(const plan::Op& op);
  std::string storage_name(const plan::Op& op) const;
  void run_stage(const plan::Op& op, const at::Tensor& input);
  void run_backward(const plan::Op& op, LeafGradients* leaves);
  // Whether a recompute will put a stashed random state into a generator.
  bool replays_random_state() const;
  const at::Tensor& available(int i) const;
  void snapshot_read_again(const at::Tensor& input);
  std::string describe_read_again(size_t i) const;

  std::vector<torch::nn::AnyModule> stages_;
  plan::Schedule schedule_;
  std::shared_ptr<const OptionForwards> option_forwards_;
  size_t loss_index_;
  bool preserve_rng_state_;
  std::shared_ptr<ExecutionObserver> observer_;

  bool input_requires_grad_ = false;
  KeptReport* report_ = nullptr;     // the forward's ReportScope's: what each stage keeps
  std::vector<at::Tensor> x_;        // standalone x_i, i = 0..L
  std::vector<bool> is_checkpoint_;  // x_i is kept until its backward
  std::vector<c10::optional<StageGraph>> graphs_;  // graphs_[i] holds x̄_{i+1}
  // The data stage i's x̄ keeps in host memory, where its option offloads.
  std::vector<std::shared_ptr<OffloadGroup>> offload_groups_;
  std::vector<c10::optional<RngStash>> rng_;          // RNG before stage i first ran
  std::vector<AutocastState> autocast_;               // autocast when stage i first ran
  std::vector<TrainingModes> training_;               // train()/eval() when stage i first ran
  std::vector<BuffersAtForward> buffers_at_forward_;  // stage i's, as its first forward found them
  std::vector<uint64_t> shared_buffers_;              // stage i's buffers another stage holds
  std::vector<bool> ran_;
  std::vector<bool> runs_again_;                                    // stage i runs more than once
  std::unordered_set<const c10::TensorImpl*> single_stage_leaves_;  // once, not every backward
  at::Tensor delta_;  // the gradient at the current position
  // x_0 and the parameters and buffers of the stages that run again, after the forward; (stage,
  // number among its parameters, then buffers) of each, stage -1 for x_0.
  VersionSnapshot read_again_;
  std::vector<std::pair<int, size_t>> read_again_origin_;
};

}  // namespace detail
}  // namespace ckpt
