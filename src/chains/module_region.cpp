#include "module_region.h"

#include <ckpt/detail/region.h>

#include "buffer_guard.h"

#include <ATen/core/grad_mode.h>

#include <unordered_set>

namespace ckpt {
namespace detail {

at::Tensor checkpoint_modules(const CheckpointOptions& options,
                              const std::vector<std::shared_ptr<torch::nn::Module>>& modules,
                              std::function<at::Tensor(const at::Tensor&)> fn,
                              const at::Tensor& input) {
  if (!at::GradMode::is_enabled()) return fn(input);
  std::vector<at::Tensor> parameters;
  std::unordered_set<const void*> seen;  // a parameter shared by several modules counts once
  for (const auto& module : modules) {
    for (const auto& parameter : module->parameters(/*recurse=*/true)) {
      if (seen.insert(parameter.unsafeGetTensorImpl()).second) parameters.push_back(parameter);
    }
  }
  Region region(options, {input}, std::move(parameters));
  at::Tensor output;
  {
    const at::AutoGradMode grad_mode(region.forward_grad_mode());
    output = fn(input);
  }
  RecomputeFn recompute = [fn, modules, input](const std::vector<at::Tensor>* replacement) {
    const BufferGuard buffers(modules);
    return std::vector<at::Tensor>{fn(replacement ? (*replacement)[0] : input)};
  };
  return region.finish({output}, std::move(recompute))[0];
}

}  // namespace detail
}  // namespace ckpt
