#include "training_modes.h"

#include <algorithm>

namespace ckpt {
namespace detail {
namespace {

// Module::train(on) sets the whole subtree; in pre-order, a child's own setting comes after its
// parent's, so each module ends in its recorded mode.
void apply(const std::vector<std::pair<std::shared_ptr<torch::nn::Module>, bool>>& modes) {
  for (const auto& [module, training] : modes) {
    if (module->is_training() != training) module->train(training);
  }
}

}  // namespace

TrainingModes::TrainingModes(const std::vector<std::shared_ptr<torch::nn::Module>>& modules) {
  for (const auto& root : modules) {
    for (auto& module : root->modules(/*include_self=*/true)) {
      const bool training = module->is_training();
      modes_.emplace_back(std::move(module), training);
    }
  }
}

bool TrainingModes::all_training() const {
  return std::all_of(modes_.begin(), modes_.end(), [](const auto& mode) { return mode.second; });
}

TrainingModeScope::TrainingModeScope(const TrainingModes& modes) {
  bool differs = false;
  for (const auto& [module, training] : modes.modes_) differs |= module->is_training() != training;
  if (!differs) return;
  previous_.modes_.reserve(modes.modes_.size());
  for (const auto& [module, training] : modes.modes_) {
    previous_.modes_.emplace_back(module, module->is_training());
  }
  apply(modes.modes_);
}

TrainingModeScope::~TrainingModeScope() {
  apply(previous_.modes_);
}

}  // namespace detail
}  // namespace ckpt
