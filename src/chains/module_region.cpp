#include "module_region.h"

#include <ckpt/checkpoint.h>

#include "buffer_guard.h"

#include <utility>
#include <vector>

namespace ckpt {
namespace detail {

at::Tensor checkpoint_modules(const CheckpointOptions& options,
                              const std::vector<std::shared_ptr<torch::nn::Module>>& modules,
                              std::function<at::Tensor(const at::Tensor&)> fn,
                              const at::Tensor& input) {
  // The region finds its border from the graph, so modules may read tensors they do not own
  // (a head tied to an embedding's weight, say). Their own parameters it checks for in-place
  // changes in both variants.
  std::vector<at::Tensor> parameters;
  for (const auto& module : modules) {
    for (const auto& parameter : module->parameters()) parameters.push_back(parameter);
  }
  return checkpoint_impl(
      options, parameters,
      [fn = std::move(fn), modules](const at::Tensor& x) {
        const BufferGuard buffers(modules);  // active only during the recompute
        return fn(x);
      },
      input);
}

}  // namespace detail
}  // namespace ckpt
