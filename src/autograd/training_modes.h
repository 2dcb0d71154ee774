#pragma once

// Recomputing modules in the mode (train() or eval()) they ran in during the forward pass.

#include <torch/nn/module.h>

#include <memory>
#include <utility>
#include <vector>

namespace ckpt {
namespace detail {

/// The train()/eval() flag of some modules and of all their submodules, taken when a region or
/// stage first runs. A model switched to eval() between the forward and the backward pass (a
/// validation pass before the backward) must still be recomputed as it ran: Dropout and
/// BatchNorm compute something else in eval mode, and the gradients would silently change.
class TrainingModes {
 public:
  TrainingModes() = default;
  explicit TrainingModes(const std::vector<std::shared_ptr<torch::nn::Module>>& modules);
  /// Whether every one of the modules was in training mode.
  bool all_training() const;

 private:
  friend class TrainingModeScope;
  // Pre-order, as Module::modules() lists them: a parent comes before its children.
  std::vector<std::pair<std::shared_ptr<torch::nn::Module>, bool>> modes_;
};

/// For its lifetime, the modules are in the modes `modes` recorded; afterwards each is back in the
/// mode it had before, also when an exception leaves the scope. Costs a comparison per module
/// when nothing changed.
class TrainingModeScope {
 public:
  explicit TrainingModeScope(const TrainingModes& modes);
  ~TrainingModeScope();
  TrainingModeScope(const TrainingModeScope&) = delete;
  TrainingModeScope& operator=(const TrainingModeScope&) = delete;

 private:
  TrainingModes previous_;  // empty when no mode differed
};

}  // namespace detail
}  // namespace ckpt
