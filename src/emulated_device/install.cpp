// install() and the public API of the emulated accelerator (include/ckpt/emulated_device.h).

#include <ckpt/emulated_device.h>

#include "allocator.h"
#include "compat/device_backend.h"
#include "devices.h"
#include "generator.h"
#include "guard.h"
#include "kernels.h"
#include "streams.h"

#include <ATen/Context.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/ones.h>
#include <c10/core/Allocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/version.h>

#include <mutex>

namespace ckpt {
namespace emulated_device {
namespace {

constexpr const char* kName = "emulated";

// What LibTorch's accelerator hooks answer (LibTorch 2.9 and later).
class Runtime final : public compat::BackendRuntime {
 public:
  c10::DeviceIndex device_count() const override { return detail::count(); }
  c10::DeviceIndex current_device() const override { return detail::current(); }
  void set_current_device(c10::DeviceIndex device) const override { detail::set_current(device); }
  const at::Generator& default_generator(c10::DeviceIndex device) const override {
    return detail::default_generator(device);
  }
  bool device_used(c10::DeviceIndex device) const override { return detail::used(device); }
  c10::Device device_of(const void* data) const override {
    return detail::DeviceMemory::instance().device_of(data);
  }
  void resize_storage(const c10::Storage& storage, size_t bytes) const override {
    detail::DeviceMemory::instance().resize(storage, bytes);
  }
};

// What of PrivateUse1 another library holds already; empty when it is free.
std::string privateuse1_holder() {
  if (c10::impl::device_guard_impl_registry[static_cast<size_t>(c10::DeviceType::PrivateUse1)]
          .load() != nullptr) {
    return "a device guard is registered for it";
  }
  const std::string name = compat::privateuse1_backend_name();
  if (!name.empty()) return "it is registered under the name '" + name + "'";
  if (compat::privateuse1_hooks_registered()) return "accelerator hooks are registered for it";
  if (c10::Dispatcher::singleton().hasBackendFallbackForDispatchKey(
          c10::DispatchKey::PrivateUse1)) {
    return "a fallback kernel is registered for it";
  }
  return "";
}

void register_backend(c10::DeviceIndex devices) {
  detail::set_count(devices);
  static c10::impl::DeviceGuardImplRegistrar guard(c10::DeviceType::PrivateUse1,
                                                   new detail::Guard());
  c10::SetAllocator(c10::DeviceType::PrivateUse1, &detail::DeviceMemory::instance());
  static const Runtime runtime;
  compat::register_privateuse1_backend(kName, runtime);
  detail::register_kernels();
  compat::register_privateuse1_autocast();
}

// The autograd engine starts one thread per device index at its first backward pass, as many as
// the largest device count then registered. A backward of the last device checks that one serves
// it: LibTorch's own error otherwise is an internal assertion.
void check_engine_threads(c10::DeviceIndex devices) {
  try {
    const auto x = at::ones({1}, at::TensorOptions().device(detail::device_of_index(devices - 1)))
                       .set_requires_grad(true);
    torch::autograd::backward({x.mul(2).sum()});
  } catch (const c10::Error& error) {
    TORCH_CHECK(false, "ckpt::emulated_device::install: the autograd engine has no thread for ",
                detail::device_of_index(devices - 1),
                ": it started its device threads at this process's first backward pass, before "
                "install(). Call install() before any backward pass. (",
                error.what_without_backtrace(), ")");
  }
}

}  // namespace

void install(int devices) {
  TORCH_CHECK(devices >= 1 && devices <= detail::kMaxDevices,
              "ckpt::emulated_device::install: devices must be between 1 and ", detail::kMaxDevices,
              ", but got ", devices, ".");
  static std::mutex mutex;
  static bool engine_serves_devices = false;
  std::lock_guard<std::mutex> lock(mutex);
  if (detail::count() > 0) {
    TORCH_CHECK(detail::count() == devices,
                "ckpt::emulated_device::install: the emulated "
                "accelerator is installed with ",
                static_cast<int>(detail::count()), " device(s), but got devices=", devices,
                ". A process has one: install it once, with one device count.");
  } else {
    // LibTorch 2.9+ takes a PrivateUse1 backend with hooks for the process's accelerator, and
    // its autograd engine then finds no stream for CUDA's nodes: every CUDA backward would fail
    // with an internal assertion (pytorch/pytorch#161129).
    TORCH_CHECK(!(compat::kPrivateUse1Hooks && at::hasCUDA()),
                "ckpt::emulated_device::install: this process has a CUDA device, and with "
                "LibTorch " TORCH_VERSION
                " the emulated accelerator would become the process's "
                "accelerator, after which every CUDA backward pass fails inside LibTorch. Use the "
                "CUDA device here, and the emulated accelerator in a process without one.");
    const std::string holder = privateuse1_holder();
    TORCH_CHECK(holder.empty(),
                "ckpt::emulated_device::install: another backend holds "
                "c10::DeviceType::PrivateUse1 (",
                holder,
                "). The emulated accelerator needs "
                "PrivateUse1: use it in a process that loads no other PrivateUse1 backend.");
    register_backend(static_cast<c10::DeviceIndex>(devices));
  }
  if (!engine_serves_devices) {  // raises again on every call while it fails
    check_engine_threads(static_cast<c10::DeviceIndex>(devices));
    engine_serves_devices = true;
  }
}

bool installed() {
  return detail::count() > 0;
}

int device_count() {
  return detail::count();
}

c10::Device device(int index) {
  detail::check_index(static_cast<c10::DeviceIndex>(index));
  return detail::device_of_index(static_cast<c10::DeviceIndex>(index));
}

std::string name() {
  return compat::kPrivateUse1Hooks ? kName : "privateuseone";
}

bool has_accelerator_hooks() {
  return compat::kPrivateUse1Hooks;
}

at::Generator default_generator(int index) {
  return detail::default_generator(static_cast<c10::DeviceIndex>(index));
}

MemoryStats memory_stats(int index) {
  const auto stats = detail::DeviceMemory::instance().stats(static_cast<c10::DeviceIndex>(index));
  return {stats.bytes.current, stats.bytes.peak, stats.blocks.current};
}

void reset_peak_memory(int index) {
  detail::DeviceMemory::instance().reset_peak(static_cast<c10::DeviceIndex>(index));
}

void set_memory_limit(int64_t bytes) {
  detail::DeviceMemory::instance().set_limit(bytes);
}

StreamHold::StreamHold(c10::Stream stream) : stream_(stream) {
  detail::hold(stream_);
}

StreamHold::~StreamHold() {
  detail::release(stream_);
}

}  // namespace emulated_device
}  // namespace ckpt
