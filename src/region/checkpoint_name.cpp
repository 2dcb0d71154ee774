// ckpt::checkpoint_name: the identity operator `ckpt::name`, which carries a tensor's name to the
// dispatch modes below autograd, where a selective region's policy sees it.

#include "autograd/dispatch_mode.h"
#include "selective.h"

#include <ckpt/selective.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <memory>
#include <mutex>

namespace ckpt {
namespace detail {
namespace {

// Below autograd (and with no mode to take the call): the tensor itself is the result.
void name_kernel(const c10::OperatorHandle& /*op*/, torch::jit::Stack* stack) {
  stack->pop_back();
}

// Autograd: the call goes on below autograd, where the modes see it, and the result is the very
// tensor that came in, so its gradient flows as if the call were not there.
void name_autograd(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  at::Tensor self = (*stack)[stack->size() - 2].toTensor();
  {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    op.callBoxed(stack);
  }
  stack->back() = std::move(self);
}

// Registered on first use and kept for the process, as the mode's fallback is (a static
// library's static initialisers would not run unless something referenced them).
const c10::OperatorHandle& name_op() {
  static const c10::OperatorHandle op = [] {
    static std::unique_ptr<torch::Library> def, kernel, autograd;
    def = std::make_unique<torch::Library>(torch::Library::DEF, "ckpt", c10::nullopt, __FILE__,
                                           __LINE__);
    // Aliasing: the result is the argument (no copy).
    def->def("name(Tensor(a) self, str name) -> Tensor(a)");
    kernel = std::make_unique<torch::Library>(torch::Library::IMPL, "ckpt",
                                              c10::DispatchKey::CompositeExplicitAutograd, __FILE__,
                                              __LINE__);
    kernel->impl("name", torch::CppFunction::makeFromBoxedFunction<&name_kernel>());
    autograd = std::make_unique<torch::Library>(torch::Library::IMPL, "ckpt",
                                                c10::DispatchKey::Autograd, __FILE__, __LINE__);
    autograd->impl("name", torch::CppFunction::makeFromBoxedFunction<&name_autograd>());
    return c10::Dispatcher::singleton().findSchemaOrThrow("ckpt::name", "");
  }();
  return op;
}

}  // namespace

bool names_tensor(const c10::OperatorHandle& op) {
  // The schema lives in the operator's table entry: one address per operator (LibTorch 1.13's
  // OperatorHandle has no ==).
  return &op.schema() == &name_op().schema();
}

}  // namespace detail

at::Tensor checkpoint_name(const at::Tensor& tensor, const std::string& name) {
  TORCH_CHECK(tensor.defined(), "ckpt::checkpoint_name: the tensor to name \"", name,
              "\" is undefined. Name a tensor the function computed.");
  TORCH_CHECK(!name.empty(),
              "ckpt::checkpoint_name: the name is empty. Give the tensor a name a policy can "
              "pick it out by, such as \"attn_out\".");
  if (!detail::dispatch_mode_active()) return tensor;  // no region with a policy is looking
  torch::jit::Stack stack{tensor, name};
  detail::name_op().callBoxed(&stack);
  return tensor;
}

}  // namespace ckpt
