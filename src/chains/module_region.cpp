#include "module_region.h"

#include <ckpt/checkpoint.h>

#include <utility>
#include <vector>

namespace ckpt {
namespace detail {

at::Tensor checkpoint_modules(const CheckpointOptions& options,
                              const std::vector<std::shared_ptr<torch::nn::Module>>& modules,
                              std::function<at::Tensor(const at::Tensor&)> fn,
                              const at::Tensor& input) {
  // The modules ride along as an argument: the region restores their buffers after the
  // recompute and, in the reentrant variant, checks their parameters for in-place changes.
  return checkpoint_impl(
      options,
      [fn = std::move(fn)](const at::Tensor& x, const ModuleList& /*modules*/) { return fn(x); },
      input, modules);
}

}  // namespace detail
}  // namespace ckpt
