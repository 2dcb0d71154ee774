#include "counted_scale.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

namespace ckpt {
namespace test {

std::atomic<int> scale_kernel_calls{0};

namespace {

at::Tensor counted_scale_kernel(const at::Tensor& x) {
  ++scale_kernel_calls;
  return x * 2;
}

class CountedScale : public torch::autograd::Function<CountedScale> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* /*ctx*/, const at::Tensor& x) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("ckpt_test::counted_scale", "")
                               .typed<at::Tensor(const at::Tensor&)>();
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    return op.call(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* /*ctx*/,
                                                 torch::autograd::variable_list grads) {
    return {grads[0] * 2};
  }
};

}  // namespace

at::Tensor counted_scale(const at::Tensor& x) {
  return CountedScale::apply(x);
}

TORCH_LIBRARY(ckpt_test, m) {
  m.def("counted_scale(Tensor x) -> Tensor");
}
TORCH_LIBRARY_IMPL(ckpt_test, CPU, m) {
  m.impl("counted_scale", counted_scale_kernel);
}
TORCH_LIBRARY_IMPL(ckpt_test, Autograd, m) {
  m.impl("counted_scale", counted_scale);
}

}  // namespace test
}  // namespace ckpt
