#include "schedule_runner.h"

#include <ckpt/detail/region.h>

#include "autograd/recompute_scope.h"
#include "stage_report.h"

#include <algorithm>

#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <optional>
#include <unordered_map>

namespace ckpt {
namespace detail {
namespace {

using plan::OpKind;

// Notifies the observer around one operation.
class OpScope {
 public:
  OpScope(ExecutionObserver* observer, const plan::Op& op) : observer_(observer), op_(op) {
    if (observer_) observer_->on_op_begin(op_);
  }
  ~OpScope() {
    if (observer_) observer_->on_op_end(op_);
  }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  ExecutionObserver* observer_;
  const plan::Op& op_;
};

}  // namespace

OptionForwards option_forwards(const std::vector<torch::nn::AnyModule>& stages,
                               const plan::Chain& profile, const StorageModes& modes,
                               const StorageSettings& settings) {
  OptionForwards forwards_of;
  forwards_of.by_stage.resize(profile.stages.size());
  forwards_of.names.resize(profile.stages.size());
  for (size_t i = 0; i < profile.stages.size(); ++i) {
    auto& forwards = forwards_of.by_stage[i];
    forwards.push_back(stage_forward(stages[i]));  // option 0: the plain stage
    for (const plan::StorageOption& option : profile.stages[i].alternatives) {
      const std::string context =
          c10::str("ckpt::PlannedSequential: storage option ", forwards.size(), " of stage ", i,
                   " is named \"", option.name,
                   "\", which is not a storage mode of "
                   "PlannedSequentialOptions().storage_modes()");
      const auto region = modes.at(option.name, context).region(settings);
      TORCH_CHECK(region.has_value(), "ckpt::PlannedSequential: stage ", i,
                  " of the profile has a \"", option.name,
                  "\" storage option, which the options turn off (for \"selective\": "
                  "PlannedSequentialOptions().selective_policy is empty). Give the options the "
                  "profile was measured with.");
      forwards.push_back(stage_forward(stages[i], region));
      forwards_of.names[i].push_back(option.name);
    }
  }
  return forwards_of;
}

ScheduleRunner::ScheduleRunner(std::vector<torch::nn::AnyModule> stages, plan::Schedule schedule,
                               std::shared_ptr<const OptionForwards> option_forwards,
                               bool preserve_rng_state, std::shared_ptr<ExecutionObserver> observer)
    : stages_(std::move(stages)),
      schedule_(std::move(schedule)),
      option_forwards_(std::move(option_forwards)),
      loss_index_(schedule_.ops.size()),
      preserve_rng_state_(preserve_rng_state),
      observer_(std::move(observer)) {
  for (size_t k = 0; k < schedule_.ops.size(); ++k) {
    if (schedule_.ops[k].kind == OpKind::Loss) loss_index_ = k;
  }
  TORCH_INTERNAL_ASSERT(loss_index_ < schedule_.ops.size(), "schedule without a loss operation");
  const size_t n = stages_.size();
  x_.resize(n + 1);
  is_checkpoint_.assign(n + 1, false);
  graphs_.resize(n);
  offload_groups_.resize(n);
  rng_.resize(n);
  autocast_.resize(n);
  training_.resize(n);
  buffers_at_forward_.resize(n);
  ran_.assign(n, false);
  // Only stages that run again need their RNG state stashed (5 KB each on the CPU).
  std::vector<int> forwards(n, 0);
  for (const auto& op : schedule_.ops) {
    if (op.kind == OpKind::ForwardNone || op.kind == OpKind::ForwardInput ||
        op.kind == OpKind::ForwardAll) {
      ++forwards[op.stage];
    }
  }
  runs_again_.resize(n);
  for (size_t i = 0; i < n; ++i) runs_again_[i] = forwards[i] > 1;
  single_stage_leaves_ = detail::single_stage_leaves(stages_);
  shared_buffers_.assign(n, 0);
  if (std::find(runs_again_.begin(), runs_again_.end(), true) != runs_again_.end()) {
    std::vector<std::shared_ptr<torch::nn::Module>> modules;
    for (const auto& stage : stages_) modules.push_back(stage.ptr());
    shared_buffers_ = buffers_shared_between(modules);
  }
}

const at::Tensor& ScheduleRunner::available(int i) const {
  if (x_[i].defined()) return x_[i];
  TORCH_INTERNAL_ASSERT(i > 0 && graphs_[i - 1].has_value(), "x_", i, " is not in memory");
  return graphs_[i - 1]->output();
}

at::Tensor ScheduleRunner::forward(const at::Tensor& input) {
  input_requires_grad_ = input.requires_grad() && is_differentiable(input);
  x_[0] = input;
  is_checkpoint_[0] = true;
  report_ = active_report();
  for (size_t k = 0; k < loss_index_; ++k) run_forward(schedule_.ops[k]);
  report_ = nullptr;
  snapshot_read_again(input);
  return available(static_cast<int>(stages_.size()));
}

void ScheduleRunner::snapshot_read_again(const at::Tensor& input) {
  read_again_.clear();
  read_again_origin_.clear();
  if (runs_again_[0]) {
    read_again_.add(input);
    read_again_origin_.emplace_back(-1, 0);
  }
  for (size_t i = 0; i < stages_.size(); ++i) {
    if (!runs_again_[i]) continue;
    // Its parameters, then its buffers (as the forward left them: a positional table read again,
    // or a BatchNorm's statistics, which the recompute puts back where it writes them).
    std::vector<at::Tensor> tensors = stages_[i].ptr()->parameters();
    for (auto& buffer : stages_[i].ptr()->buffers()) tensors.push_back(std::move(buffer));
    for (size_t j = 0; j < tensors.size(); ++j) {
      read_again_.add(tensors[j]);
      read_again_origin_.emplace_back(static_cast<int>(i), j);
    }
  }
}

std::string ScheduleRunner::describe_read_again(size_t i) const {
  const auto [stage, j] = read_again_origin_[i];
  if (stage < 0) return "the input of the chain";
  const torch::nn::Module& module = *stages_[static_cast<size_t>(stage)].ptr();
  const auto parameters = module.named_parameters();
  const bool parameter = j < parameters.size();
  const std::string name =
      parameter ? parameters[j].key() : module.named_buffers()[j - parameters.size()].key();
  return (parameter ? "parameter '" : "buffer '") + name + "' of stage " + std::to_string(stage);
}

void ScheduleRunner::run_forward(const plan::Op& op) {
  const OpScope scope(observer_.get(), op);
  const int i = op.stage;
  const at::Tensor input = available(i);
  // A stage that already ran is being recomputed: replay its RNG (the CPU's and its input's
  // device's) and autocast state, as a region does, start from the buffers its first forward
  // read, and leave them as that forward left them.
  const ModuleList stage{stages_[i].ptr()};
  const bool first = !ran_[i];
  c10::optional<RecomputeScope> recompute;
  if (!first) {
    recompute.emplace(rng_[i], autocast_[i], training_[i], stage, &buffers_at_forward_[i]);
  } else {
    const c10::DeviceType device_type = infer_device_type({input});
    if (preserve_rng_state_ && runs_again_[i])
      rng_[i].emplace(std::vector<at::Tensor>{input}, device_type);
    if (runs_again_[i]) {
      autocast_[i] = AutocastState::current(device_type);
      training_[i] = TrainingModes(stage);
      buffers_at_forward_[i] = BuffersAtForward(stage, ~uint64_t{0}, shared_buffers_[i]);
    }
    ran_[i] = true;
  }
  std::optional<StageReport> report;
  if (report_ != nullptr) report.emplace(*report_, op, input, storage_name(op));
  run_stage(op, input);
  if (first && runs_again_[i]) buffers_at_forward_[i].finish();
  if (rng_[i].has_value()) {
    if (recompute) {
      recompute->check_random_draws(std::nullopt, std::nullopt, "ckpt::PlannedSequential");
    } else {
      // A stage that drew no random numbers on the CPU needs no stashed CPU state (5 KB each).
      rng_[i]->note_forward_end();
    }
  }
  if (report) {
    report->finish(x_[i].defined(), graphs_[i] ? graphs_[i]->output() : at::Tensor(),
                   rng_[i].has_value() ? &*rng_[i] : nullptr,
                   i + 1 == static_cast<int>(stages_.size()));
  }
}

// How the stage stores in the operation, as reports name it.
std::string ScheduleRunner::storage_name(const plan::Op& op) const {
  if (op.kind != OpKind::ForwardAll) return plan::to_string(op.kind);
  if (op.option == 0) return "plain";
  return option_forwards_->names.at(static_cast<size_t>(op.stage))
      .at(static_cast<size_t>(op.option - 1));
}

void ScheduleRunner::run_stage(const plan::Op& op, const at::Tensor& input) {
  const int i = op.stage;

  if (op.kind == OpKind::ForwardAll) {
    const bool needs_grad = i > 0 ? is_differentiable(input) : input_requires_grad_;
    const StageForward& forward = option_forwards_->of(i, op.option);
    // An offloaded stage's data comes back where the plan says (its look-ahead), not by itself.
    ManualOffloadScope offloads;
    graphs_[i].emplace(forward, input, needs_grad);
    offload_groups_[i] = offloads.take_last();
    return;
  }
  at::Tensor output;
  {
    const at::NoGradGuard no_grad;
    output = stages_[i].forward<at::Tensor>(input);
  }
  x_[i + 1] = std::move(output);
  if (op.kind == OpKind::ForwardInput) {
    is_checkpoint_[i] = true;
  } else if (i > 0 && x_[i].defined() && !is_checkpoint_[i]) {
    x_[i].reset();
  }
}

at::Tensor ScheduleRunner::backward(at::Tensor grad_output, LeafGradients* leaves) {
  read_again_.check("ckpt::PlannedSequential", [this](size_t i) { return describe_read_again(i); });
  // Recomputes that replay a stage's random numbers must not move the caller's random streams;
  // where none does, no state is kept (5 KB on the CPU, in the step's peak).
  c10::optional<RngRestore> restore;
  if (replays_random_state())
    restore.emplace(std::vector<at::Tensor>{x_[0]}, infer_device_type({x_[0]}));
  const int n = static_cast<int>(stages_.size());
  x_[n].reset();  // the loss consumed x_L
  delta_ = std::move(grad_output);
  for (size_t k = loss_index_ + 1; k < schedule_.ops.size(); ++k) {
    const plan::Op& op = schedule_.ops[k];
    if (op.kind == OpKind::Backward) {
      run_backward(op, leaves);
    } else {
      run_forward(op);
    }
  }
  x_[0].reset();
  return std::move(delta_);
}

bool ScheduleRunner::replays_random_state() const {
  return std::any_of(rng_.begin(), rng_.end(), [](const c10::optional<RngStash>& stash) {
    return stash.has_value() && stash->holds_state();
  });
}

void ScheduleRunner::run_backward(const plan::Op& op, LeafGradients* leaves) {
  const OpScope scope(observer_.get(), op);
  const int i = op.stage;
  TORCH_INTERNAL_ASSERT(graphs_[i].has_value(), "backward of stage ", i, " without its graph");
  if (i > 0 && offload_groups_[i - 1] &&
      std::binary_search(schedule_.look_ahead.begin(), schedule_.look_ahead.end(), i - 1)) {
    // The stage's own data first, then the next stage's behind it, on the same side stream.
    if (offload_groups_[i]) offload_groups_[i]->prefetch();
    offload_groups_[i - 1]->prefetch_ahead();
  }
  at::Tensor grad_output = std::move(delta_);
  delta_ = leaves != nullptr ? graphs_[i]->backward(std::move(grad_output), *leaves)
                             : graphs_[i]->input_gradient(std::move(grad_output));
  graphs_[i].reset();
  offload_groups_[i].reset();
  buffers_at_forward_[i] = BuffersAtForward();  // the stage runs no more
  if (i > 0) {
    x_[i].reset();
    is_checkpoint_[i] = false;
  }
}

}  // namespace detail
}  // namespace ckpt
