#pragma once

// How the emulated accelerator runs operators: with LibTorch's CPU kernels, on the device's memory
// (which is host memory). A boxed fallback for PrivateUse1 gives each operator CPU tensors that
// share the device tensors' memory, the device's generator, and wraps what it returns back as
// device tensors.

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <string>

namespace ckpt {
namespace emulated_device {
namespace detail {

/// The boxed fallback registered for every operator without a kernel of its own on PrivateUse1.
void cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);

/// Raises LibTorch's error for an operator (`op`) whose tensors are on two devices of the
/// emulated accelerator, `first` and `other`, as a GPU does; nothing where they are one.
void check_same_device(c10::DeviceIndex first, c10::DeviceIndex other, const std::string& op);

/// A CPU tensor over the same memory as `tensor` (a device tensor), with its sizes and strides.
/// A CPU tensor is returned as it is.
at::Tensor host_alias(const at::Tensor& tensor);

/// A device tensor on `device` with the sizes, strides and contents of the CPU tensor `host`.
at::Tensor copy_to_device(const at::Tensor& host, c10::DeviceIndex device);

/// A device tensor that views `storage` (a device storage) as `like` views its own.
at::Tensor device_view(const c10::Storage& storage, const at::Tensor& like);

}  // namespace detail
}  // namespace emulated_device
}  // namespace ckpt
