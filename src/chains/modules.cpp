#include <ckpt/modules.h>

#include "module_region.h"

#include <c10/util/Exception.h>

namespace ckpt {

CheckpointedImpl::CheckpointedImpl(torch::nn::AnyModule module, const CheckpointOptions& options)
    : options(options), module_(std::move(module)) {
  TORCH_CHECK(!module_.is_empty(),
              "ckpt::Checkpointed: the module to wrap is empty. Pass a constructed module.");
  // Adopt the wrapped module's own members under their own names, so that the wrapper adds no
  // prefix to any parameter or buffer name.
  const auto inner = module_.ptr();
  for (const auto& item : inner->named_parameters(/*recurse=*/false)) {
    register_parameter(item.key(), item.value(), item.value().requires_grad());
  }
  for (const auto& item : inner->named_buffers(/*recurse=*/false)) {
    register_buffer(item.key(), item.value());
  }
  for (const auto& item : inner->named_children()) register_module(item.key(), item.value());
}

torch::Tensor CheckpointedImpl::forward(const torch::Tensor& input) {
  auto module = module_;
  return detail::checkpoint_modules(
      options, {module.ptr()},
      [module](const torch::Tensor& x) mutable { return module.forward<torch::Tensor>(x); }, input);
}

void CheckpointedImpl::pretty_print(std::ostream& stream) const {
  stream << "ckpt::Checkpointed(use_reentrant=" << (options.use_reentrant() ? "true" : "false")
         << ", preserve_rng_state=" << (options.preserve_rng_state() ? "true" : "false") << ")";
}

torch::nn::Sequential apply_checkpointing(
    const torch::nn::Sequential& sequential,
    const std::function<bool(const std::string& name, const torch::nn::Module& module)>& predicate,
    const CheckpointOptions& options) {
  TORCH_CHECK(!sequential.is_empty(),
              "ckpt::apply_checkpointing: the Sequential is a null holder. Pass a constructed "
              "torch::nn::Sequential.");
  torch::nn::Sequential result;
  const auto children = sequential->named_children();
  size_t index = 0;
  for (const auto& module : *sequential) {
    std::string name = children[index++].key();
    if (predicate(name, *module.ptr())) {
      result->push_back(std::move(name), torch::nn::AnyModule(Checkpointed(module, options)));
    } else {
      result->push_back(std::move(name), module);
    }
  }
  return result;
}

}  // namespace ckpt
