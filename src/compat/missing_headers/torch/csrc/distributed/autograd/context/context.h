#pragma once

// Stands in for a header that Debian's libtorch-dev 1.13 does not ship, although its c10d
// reducer.hpp includes it: the Reducer only names DistAutogradContext::GradCallback (in a
// static_assert) and holds a ContextPtr (a shared_ptr) in a member. ckpt_distributed adds this
// folder to its include path only where the real header is missing (cmake/distributed.cmake),
// and never uses distributed autograd.

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>

namespace torch {
namespace distributed {
namespace autograd {

class DistAutogradContext {
 public:
  using GradCallback = std::function<bool(at::Tensor&)>;
};

using ContextPtr = std::shared_ptr<DistAutogradContext>;

}  // namespace autograd
}  // namespace distributed
}  // namespace torch
