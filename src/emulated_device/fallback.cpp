#include "fallback.h"

#include "allocator.h"
#include "devices.h"
#include "generator.h"
#include "streams.h"

#include <ATen/core/enum_tag.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/Exception.h>

#include <cstring>
#include <optional>
#include <vector>

namespace ckpt {
namespace emulated_device {
namespace detail {
namespace {

bool is_device_tensor(const at::Tensor& tensor) {
  return tensor.defined() && tensor.device().type() == c10::DeviceType::PrivateUse1;
}

bool is_generator(const c10::Argument& argument) {
  c10::TypePtr type = argument.type();
  if (auto optional = type->cast<c10::OptionalType>()) type = optional->getElementType();
  return type->kind() == c10::TypeKind::GeneratorType;
}

// Keeps a device storage alive while a host alias uses its memory.
void release_storage(void* context) {
  delete static_cast<c10::Storage*>(context);
}

// Gives `view` the geometry of `like`, and its conjugate and negative bits (lazy views: dropping
// them gives wrong values, and the conjugate fallback called the kernel again without end).
void set_view(const at::Tensor& view, const at::Tensor& like) {
  c10::TensorImpl& impl = *view.unsafeGetTensorImpl();
  impl.set_sizes_and_strides(like.sizes(), like.strides());
  impl.set_storage_offset(like.storage_offset());
  impl._set_conj(like.is_conj());
  impl._set_neg(like.is_neg());
}

// A written argument the CPU kernel resized into new memory, or whose sizes it changed: the device
// tensor takes the new memory's contents and the new sizes.
void write_back(const at::Tensor& device, const at::Tensor& host) {
  c10::StorageImpl* storage = device.storage().unsafeGetStorageImpl();
  const c10::Storage& written = host.storage();
  if (written.data_ptr().get() != storage->data_ptr().get() ||
      written.nbytes() != storage->nbytes()) {
    const size_t bytes = written.nbytes();
    c10::DataPtr data = DeviceMemory::instance().allocate_on(device.device().index(), bytes);
    if (bytes > 0) std::memcpy(data.get(), written.data_ptr().get(), bytes);
    storage->set_data_ptr_noswap(std::move(data));
    storage->set_nbytes(bytes);
  }
  if (device.sizes() != host.sizes() || device.strides() != host.strides() ||
      device.storage_offset() != host.storage_offset()) {
    set_view(device, host);
  }
}

// One operator call: its device tensors in, as host aliases, and its results out, as device
// tensors that keep the aliasing the CPU kernel gave them.
class HostCall {
 public:
  explicit HostCall(const c10::OperatorHandle& op) : op_(op) {}

  void run(torch::jit::Stack* stack) {
    const auto& arguments = op_.schema().arguments();
    const size_t first = stack->size() - arguments.size();
    bool draws_from_generator = false;
    for (size_t i = 0; i < arguments.size(); ++i) {
      if (is_generator(arguments[i])) {
        draws_from_generator = true;
      } else {
        (*stack)[first + i] = to_host(i, (*stack)[first + i]);
      }
    }
    const c10::DeviceIndex device = device_.value_or(current());
    for (size_t i = 0; i < arguments.size(); ++i) {
      if (is_generator(arguments[i])) (*stack)[first + i] = generator_to_host((*stack)[first + i]);
    }
    TORCH_CHECK(draws_from_generator || !op_.hasTag(at::Tag::nondeterministic_seeded),
                "ckpt::emulated_device: ", op_.schema().operator_name(),
                " draws random numbers but takes no generator, and has no kernel of the emulated "
                "device: its CPU kernel would draw from the CPU's generator.");
    // Kernels run on the calling thread: on a non-default stream, after the stream's earlier work.
    synchronize(current_stream(device));
    op_.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
    for (const Alias& alias : aliases_) {
      const c10::AliasInfo* info = arguments[alias.argument].alias_info();
      if (info != nullptr && info->isWrite()) write_back(alias.device, alias.host);
    }
    const size_t returns = op_.schema().returns().size();
    for (size_t i = stack->size() - returns; i < stack->size(); ++i) {
      (*stack)[i] = to_device((*stack)[i], device);
    }
  }

 private:
  struct Alias {
    size_t argument;
    at::Tensor device;
    at::Tensor host;
  };

  void note_device(c10::DeviceIndex index) {
    if (device_) check_same_device(*device_, index, c10::str(op_.schema().operator_name()));
    device_ = index;
  }

  at::Tensor tensor_to_host(size_t argument, const at::Tensor& tensor) {
    if (!is_device_tensor(tensor)) return tensor;
    note_device(tensor.device().index());
    aliases_.push_back({argument, tensor, host_alias(tensor)});
    return aliases_.back().host;
  }

  c10::IValue to_host(size_t argument, const c10::IValue& value) {
    if (value.isTensor()) return tensor_to_host(argument, value.toTensor());
    if (value.isTensorList()) {
      const auto source = value.toTensorList();
      c10::List<at::Tensor> list;
      for (size_t i = 0; i < source.size(); ++i)
        list.push_back(tensor_to_host(argument, source[i]));
      return list;
    }
    if (value.isList()) {  // Tensor?[]
      const auto source = value.toList();
      c10::impl::GenericList list(source.elementType());
      for (size_t i = 0; i < source.size(); ++i) {
        const c10::IValue element = source.get(i);
        list.push_back(element.isTensor() ? tensor_to_host(argument, element.toTensor()) : element);
      }
      return list;
    }
    if (value.isDevice() && value.toDevice().type() == c10::DeviceType::PrivateUse1) {
      note_device(resolve(value.toDevice().index()));  // a factory: its result goes to the device
      return c10::Device(c10::DeviceType::CPU);
    }
    return value;
  }

  c10::IValue generator_to_host(const c10::IValue& value) const {
    const c10::DeviceIndex device = device_.value_or(current());
    if (value.isNone()) return host_generator(default_generator(device));
    return host_generator(value.toGenerator());
  }

  at::Tensor tensor_to_device(const at::Tensor& host, c10::DeviceIndex device) const {
    if (!host.defined() || is_device_tensor(host)) return host;
    for (const Alias& alias : aliases_) {
      if (alias.host.unsafeGetTensorImpl() == host.unsafeGetTensorImpl()) return alias.device;
    }
    for (const Alias& alias : aliases_) {
      if (alias.host.storage().unsafeGetStorageImpl() == host.storage().unsafeGetStorageImpl()) {
        return device_view(alias.device.storage(), host);  // a view of an argument
      }
    }
    return copy_to_device(host, device);
  }

  c10::IValue to_device(const c10::IValue& value, c10::DeviceIndex device) const {
    if (value.isTensor()) return tensor_to_device(value.toTensor(), device);
    if (value.isTensorList()) {
      const auto source = value.toTensorList();
      c10::List<at::Tensor> list;
      for (size_t i = 0; i < source.size(); ++i)
        list.push_back(tensor_to_device(source[i], device));
      return list;
    }
    return value;
  }

  const c10::OperatorHandle& op_;
  std::optional<c10::DeviceIndex> device_;
  std::vector<Alias> aliases_;
};

}  // namespace

void check_same_device(c10::DeviceIndex first, c10::DeviceIndex other, const std::string& op) {
  TORCH_CHECK(first == other,
              "Expected all tensors to be on the same device, but found at least two devices, ",
              device_of_index(first), " and ", device_of_index(other), "! (in ", op, ")");
}

void cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  HostCall(op).run(stack);
}

at::Tensor host_alias(const at::Tensor& tensor) {
  if (!is_device_tensor(tensor)) return tensor;
  TORCH_CHECK(tensor.layout() == c10::kStrided,
              "ckpt::emulated_device: only strided tensors are supported, but got layout ",
              tensor.layout());
  const c10::Storage& storage = tensor.storage();
  // The alias's own storage points into the device storage's memory and keeps it alive; a kernel
  // that resizes the alias gives it new CPU memory (write_back() then copies it to the device).
  c10::DataPtr data(storage.data_ptr().get(), new c10::Storage(storage), &release_storage,
                    c10::Device(c10::DeviceType::CPU));
  auto host_storage = c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), static_cast<int64_t>(storage.nbytes()), std::move(data),
      c10::GetCPUAllocator(), /*resizable=*/true);
  auto host = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(std::move(host_storage)),
                                                       c10::DispatchKeySet(c10::DispatchKey::CPU),
                                                       tensor.dtype());
  set_view(host, tensor);
  return host;
}

at::Tensor device_view(const c10::Storage& storage, const at::Tensor& like) {
  auto view = at::detail::make_tensor<c10::TensorImpl>(
      c10::Storage(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), like.dtype());
  set_view(view, like);
  return view;
}

at::Tensor copy_to_device(const at::Tensor& host, c10::DeviceIndex device) {
  TORCH_CHECK(host.layout() == c10::kStrided,
              "ckpt::emulated_device: only strided tensors are supported, but an operator "
              "returned layout ",
              host.layout());
  const size_t bytes = host.storage().nbytes();
  DeviceMemory& memory = DeviceMemory::instance();
  c10::DataPtr data = memory.allocate_on(device, bytes);
  if (bytes > 0) std::memcpy(data.get(), host.storage().data_ptr().get(), bytes);
  c10::Storage storage(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), static_cast<int64_t>(bytes), std::move(data), &memory,
      /*resizable=*/true));
  return device_view(storage, host);
}

}  // namespace detail
}  // namespace emulated_device
}  // namespace ckpt
