#pragma once

#include <ckpt/options.h>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>

#include <functional>
#include <memory>
#include <ostream>
#include <string>

namespace ckpt {

/// Wraps a module so that its forward runs as a checkpointed region.
///
/// The wrapper registers the wrapped module's own parameters, buffers and children under their
/// own names, so `named_parameters()`, `named_buffers()` and a saved state are the same with and
/// without the wrapper: a model saved wrapped loads unwrapped and back. Buffers are updated once
/// per step (the recompute restores them). The wrapped module's forward must take and return one
/// tensor.
///
/// Example:
/// ```
/// ckpt::Checkpointed block(torch::nn::Linear(64, 64));
/// auto y = block(x);
/// ```
class CheckpointedImpl : public torch::nn::Module {
 public:
  explicit CheckpointedImpl(torch::nn::AnyModule module, const CheckpointOptions& options = {});
  template <class ModuleType>
  explicit CheckpointedImpl(torch::nn::ModuleHolder<ModuleType> module,
                            const CheckpointOptions& options = {})
      : CheckpointedImpl(torch::nn::AnyModule(std::move(module)), options) {}

  /// Runs the wrapped module's forward as a checkpointed region.
  torch::Tensor forward(const torch::Tensor& input);

  /// The wrapped module.
  std::shared_ptr<torch::nn::Module> wrapped() const { return module_.ptr(); }

  void pretty_print(std::ostream& stream) const override;

  /// The options the region runs with.
  CheckpointOptions options;

 private:
  torch::nn::AnyModule module_;
};

/// A `ModuleHolder` subclass for `CheckpointedImpl`.
TORCH_MODULE(Checkpointed);

/// Returns a copy of `sequential` in which every child for which `predicate(name, module)` is true
/// is wrapped in `Checkpointed`, like Python's `apply_activation_checkpointing`. The copy shares
/// the modules (and so the parameters) of `sequential`; parameter and buffer names are unchanged.
torch::nn::Sequential apply_checkpointing(
    const torch::nn::Sequential& sequential,
    const std::function<bool(const std::string& name, const torch::nn::Module& module)>& predicate,
    const CheckpointOptions& options = {});

}  // namespace ckpt
