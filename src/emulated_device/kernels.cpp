#include "kernels.h"

#include "allocator.h"
#include "devices.h"
#include "fallback.h"
#include "recurrent.h"
#include "streams.h"

#include <ATen/EmptyTensor.h>
#include <ATen/ops/convolution.h>
#include <ATen/ops/convolution_backward.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/resize_native.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <array>
#include <initializer_list>
#include <tuple>

namespace ckpt {
namespace emulated_device {
namespace detail {
namespace {

constexpr c10::DispatchKeySet kDeviceKeys{c10::DispatchKey::PrivateUse1};

c10::Device check_factory(c10::optional<c10::Device> device, c10::optional<c10::Layout> layout,
                          c10::optional<bool> pin_memory) {
  TORCH_CHECK(c10::layout_or_default(layout) == c10::kStrided,
              "ckpt::emulated_device: only strided tensors are supported, but got layout ",
              c10::layout_or_default(layout));
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "Only dense CPU tensors can be pinned");
  return c10::device_or_default(device);
}

at::Tensor empty(at::IntArrayRef size, c10::optional<c10::ScalarType> dtype,
                 c10::optional<c10::Layout> layout, c10::optional<c10::Device> device,
                 c10::optional<bool> pin_memory, c10::optional<c10::MemoryFormat> format) {
  const c10::DeviceGuard guard(check_factory(device, layout, pin_memory));
  return at::detail::empty_generic(size, &DeviceMemory::instance(), kDeviceKeys,
                                   c10::dtype_or_default(dtype), format);
}

at::Tensor empty_strided(at::IntArrayRef size, at::IntArrayRef stride,
                         c10::optional<c10::ScalarType> dtype, c10::optional<c10::Layout> layout,
                         c10::optional<c10::Device> device, c10::optional<bool> pin_memory) {
  const c10::DeviceGuard guard(check_factory(device, layout, pin_memory));
  return at::detail::empty_strided_generic(size, stride, &DeviceMemory::instance(), kDeviceKeys,
                                           c10::dtype_or_default(dtype));
}

// Copies between host and device and between devices run on the current stream of the device
// involved (the source's, between devices, as on CUDA): at once on the default stream, later on
// another, where a blocking copy then waits for it.
at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  const c10::DeviceIndex device = self.device().type() == c10::DeviceType::PrivateUse1
                                      ? self.device().index()
                                      : dst.device().index();
  at::Tensor source = host_alias(self);
  at::Tensor target = host_alias(dst);
  const c10::Stream stream = current_stream(device);
  run_on(stream, [source, target]() mutable { target.copy_(source); });
  if (!non_blocking) synchronize(stream);
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  dst.resize_(self.sizes());
  return copy_from(self, dst, /*non_blocking=*/false);
}

const at::Tensor& resize(const at::Tensor& self, at::IntArrayRef size,
                         c10::optional<c10::MemoryFormat> format) {
  // LibTorch's CPU resize, which grows the storage through its allocator: the device's.
  const c10::DeviceGuard guard(self.device());
  return at::native::resize_(self, size, format);
}

// The storage must hold what the tensor's sizes reach: grown, as resize_ would, if it doesn't.
at::Tensor& set_storage(at::Tensor& self, c10::Storage source, int64_t offset, at::IntArrayRef size,
                        at::IntArrayRef stride) {
  TORCH_CHECK(source.device() == self.device(), "Attempted to set the storage of a tensor on ",
              self.device(), " to a storage on ", source.device());
  c10::TensorImpl* impl = self.unsafeGetTensorImpl();
  impl->set_storage_keep_dtype(std::move(source));
  impl->set_storage_offset(offset);
  if (stride.empty()) {
    impl->set_sizes_contiguous(size);
  } else {
    impl->set_sizes_and_strides(size, stride);
  }
  const auto needed = self.numel() == 0 ? 0
                                        : at::detail::computeStorageNbytes(size, impl->strides(),
                                                                           self.itemsize(), offset);
  if (needed > self.storage().nbytes()) DeviceMemory::instance().resize(self.storage(), needed);
  return self;
}

at::Tensor& set_source_storage(at::Tensor& self, c10::Storage source) {
  const auto elements = static_cast<int64_t>(source.nbytes() / self.itemsize());
  return set_storage(self, std::move(source), 0, {elements}, {});
}

at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& source) {
  if (self.is_same(source)) return self;
  return set_storage(self, source.storage(), source.storage_offset(), source.sizes(),
                     source.strides());
}

// ATen's native_dropout runs a CPU kernel that draws from the CPU's generator: here the same
// computation (ATen's native_dropout_cpu) runs from device operators, so the mask comes from the
// device's generator.
std::tuple<at::Tensor, at::Tensor> native_dropout(const at::Tensor& input, double p,
                                                  c10::optional<bool> train) {
  if (input.numel() == 0) return {input, at::empty_like(input, input.options())};
  if (train.has_value() && !*train) {
    return {input.clone(), at::ones_like(input, input.options().dtype(c10::kBool))};
  }
  const double keep = 1. - p;
  const double scale = keep == 0 ? 0. : 1. / keep;
  at::Tensor mask = at::empty_like(input, LEGACY_CONTIGUOUS_MEMORY_FORMAT);
  mask.bernoulli_(keep);
  at::Tensor output = input.mul(mask).mul_(scale);
  return {output, mask};
}

// The device of an operator's tensors (undefined ones aside): one, or an error as on a GPU.
c10::DeviceIndex device_of(const char* op, std::initializer_list<at::Tensor> tensors) {
  const c10::DeviceIndex device = tensors.begin()->device().index();
  for (const at::Tensor& t : tensors) {
    if (t.defined()) check_same_device(device, t.device().index(), op);
  }
  return device;
}

// LibTorch sends convolutions on other backends to convolution_overrideable, whose default throws
// (so the boxed fallback never sees them): here the CPU's convolution runs on the device's memory.
at::Tensor convolution(const at::Tensor& input, const at::Tensor& weight,
                       const c10::optional<at::Tensor>& bias, at::IntArrayRef stride,
                       at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed,
                       at::IntArrayRef output_padding, int64_t groups) {
  const c10::DeviceIndex device =
      device_of("aten::convolution_overrideable", {input, weight, bias.value_or(at::Tensor())});
  synchronize(current_stream(device));
  const c10::optional<at::Tensor> host_bias =
      bias && bias->defined() ? c10::optional<at::Tensor>(host_alias(*bias)) : c10::nullopt;
  return copy_to_device(at::convolution(host_alias(input), host_alias(weight), host_bias, stride,
                                        padding, dilation, transposed, output_padding, groups),
                        device);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
    at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed,
    at::IntArrayRef output_padding, int64_t groups, std::array<bool, 3> output_mask) {
  const c10::DeviceIndex device =
      device_of("aten::convolution_backward_overrideable", {grad_output, input, weight});
  synchronize(current_stream(device));
  // The bias's size is the output's channel count (the CPU kernel checks it when it is asked for).
  const int64_t channels = grad_output.size(1);
  auto grads = at::convolution_backward(
      host_alias(grad_output), host_alias(input), host_alias(weight), at::IntArrayRef(channels),
      stride, padding, dilation, transposed, output_padding, groups, output_mask);
  auto back = [device](const at::Tensor& host) {
    return host.defined() ? copy_to_device(host, device) : host;
  };
  return {back(std::get<0>(grads)), back(std::get<1>(grads)), back(std::get<2>(grads))};
}

// Module::to() moves parameters with set_data, which accepts only tensors of compatible types:
// dense CPU and dense emulated-device tensors are, as dense CPU and CUDA ones are.
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  auto dense = [](const at::Tensor& t) {
    return t.layout() == c10::kStrided &&
           (t.device().is_cpu() || t.device().type() == c10::DeviceType::PrivateUse1);
  };
  return (dense(self) && dense(from)) ||
         self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set());
}

}  // namespace

void register_kernels() {
  // The registrations last as long as their Library objects: kept for the process.
  static torch::Library* kernels = nullptr;
  static torch::Library* autograd = nullptr;
  static torch::Library* fallback = nullptr;
  static torch::Library* conjugate = nullptr;
  static torch::Library* negative = nullptr;
  if (kernels != nullptr) return;
  constexpr auto key = c10::DispatchKey::PrivateUse1;
  kernels = new torch::Library(torch::Library::IMPL, "aten", key, __FILE__, __LINE__);
  kernels->impl("empty.memory_format", TORCH_FN(empty));
  kernels->impl("empty_strided", TORCH_FN(empty_strided));
  kernels->impl("_copy_from", TORCH_FN(copy_from));
  kernels->impl("_copy_from_and_resize", TORCH_FN(copy_from_and_resize));
  kernels->impl("resize_", TORCH_FN(resize));
  kernels->impl("set_.source_Storage_storage_offset", TORCH_FN(set_storage));
  kernels->impl("set_.source_Storage", TORCH_FN(set_source_storage));
  kernels->impl("set_.source_Tensor", TORCH_FN(set_source_tensor));
  kernels->impl("native_dropout", TORCH_FN(native_dropout));
  kernels->impl("convolution_overrideable", TORCH_FN(convolution));
  kernels->impl("convolution_backward_overrideable", TORCH_FN(convolution_backward));
  kernels->impl("_has_compatible_shallow_copy_type", TORCH_FN(has_compatible_shallow_copy_type));
  register_recurrent_kernels(*kernels);
  // A composite-implicit operator with a backend kernel needs one for the backend's autograd key
  // too (LibTorch 1.13 leaves that key without one).
  autograd = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::AutogradPrivateUse1,
                                __FILE__, __LINE__);
  autograd->impl("_has_compatible_shallow_copy_type", TORCH_FN(has_compatible_shallow_copy_type));
  // The copies take conjugate and negative views as they are (the host aliases keep the bits, and
  // the CPU copy resolves them), as CUDA's copy kernel does. Through LibTorch's fallback for those
  // bits, a copy would first materialize its source with a clone, which copies again: no end.
  conjugate = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::Conjugate,
                                 __FILE__, __LINE__);
  negative = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::Negative, __FILE__,
                                __LINE__);
  for (torch::Library* bit : {conjugate, negative}) {
    bit->impl("_copy_from", torch::CppFunction::makeFallthrough());
    bit->impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
  }
  fallback = new torch::Library(torch::Library::IMPL, "_", key, __FILE__, __LINE__);
  fallback->fallback(torch::CppFunction::makeFromBoxedFunction<&cpu_fallback>());
}

}  // namespace detail
}  // namespace emulated_device
}  // namespace ckpt
