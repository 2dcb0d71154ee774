#include "device_backend.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#if CKPT_TORCH_AT_LEAST(2, 9)
#include <ATen/Operators.h>
#include <ATen/autocast_mode.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#endif

#include <cstring>

namespace ckpt {
namespace compat {

#if CKPT_TORCH_AT_LEAST(2, 3)
void DeviceAllocatorBase::copy_data(void* dest, const void* src, std::size_t count) const {
  std::memcpy(dest, src, count);
}
#endif

#if CKPT_TORCH_AT_LEAST(2, 9)
namespace {
void fill(c10::CachingAllocator::StatArray& array, const AllocatorStat& stat) {
  auto& all = array[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
  all.current = stat.current;
  all.peak = stat.peak;
  all.allocated = stat.allocated;
  all.freed = stat.freed;
}
}  // namespace

c10::CachingDeviceAllocator::DeviceStats DeviceAllocatorBase::getDeviceStats(
    c10::DeviceIndex device) {
  // No cache: every live block is allocated, active, requested and reserved at once.
  const AllocatorStats now = stats(device);
  c10::CachingDeviceAllocator::DeviceStats result;
  for (auto* bytes : {&result.allocated_bytes, &result.reserved_bytes, &result.active_bytes,
                      &result.requested_bytes}) {
    fill(*bytes, now.bytes);
  }
  for (auto* blocks : {&result.allocation, &result.segment, &result.active}) {
    fill(*blocks, now.blocks);
  }
  result.num_device_alloc = now.blocks.allocated;
  result.num_device_free = now.blocks.freed;
  return result;
}

namespace {

// LibTorch's device-generic code (Context::defaultGenerator, manual_seed, the accelerator API)
// asks these hooks; they answer from the backend.
class Hooks final : public at::PrivateUse1HooksInterface {
 public:
  explicit Hooks(const BackendRuntime& runtime) : runtime_(runtime) {}
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return runtime_.device_count() > 0; }
  void init() const override {}
  c10::DeviceIndex deviceCount() const override { return runtime_.device_count(); }
  c10::DeviceIndex getCurrentDevice() const override { return runtime_.current_device(); }
  void setCurrentDevice(c10::DeviceIndex device) const override {
    runtime_.set_current_device(device);
  }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    const auto previous = runtime_.current_device();
    if (device >= 0) runtime_.set_current_device(device);
    return previous;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override {
    return exchangeDevice(device);
  }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex device) const override {
    return runtime_.default_generator(device < 0 ? runtime_.current_device() : device);
  }
  bool hasPrimaryContext(c10::DeviceIndex device) const override {
    return runtime_.device_used(device);
  }
  at::Device getDeviceFromPtr(void* data) const override { return runtime_.device_of(data); }
  bool isPinnedPtr(const void* /*data*/) const override { return false; }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t bytes) const override {
    runtime_.resize_storage(storage, bytes);
  }

 private:
  const BackendRuntime& runtime_;
};

}  // namespace
#endif

std::string privateuse1_backend_name() {
#if CKPT_TORCH_AT_LEAST(2, 9)
  return c10::is_privateuse1_backend_registered() ? c10::get_privateuse1_backend() : "";
#else
  return "";
#endif
}

bool privateuse1_hooks_registered() {
#if CKPT_TORCH_AT_LEAST(2, 9)
  return at::isPrivateUse1HooksRegistered();
#else
  return false;
#endif
}

void register_privateuse1_backend(const std::string& name, const BackendRuntime& runtime) {
#if CKPT_TORCH_AT_LEAST(2, 9)
  c10::register_privateuse1_backend(name);
  at::RegisterPrivateUse1HooksInterface(new Hooks(runtime));  // kept for the process
#else
  (void)name;
  (void)runtime;
#endif
}

#if CKPT_TORCH_AT_LEAST(2, 9)
namespace {
// CUDA's autocast policies (ATen's autocast_mode.cpp), for the PrivateUse1 key.
void register_autocast_kernels(torch::Library& m) {
  using namespace at;  // the policy lists name Tensor, Scalar, ... unqualified
#define CKPT_LOWER_PRECISION_FP(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define CKPT_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define CKPT_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define CKPT_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_LOWER_PRECISION_FP(CKPT_LOWER_PRECISION_FP)
  AT_FORALL_FP32(CKPT_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(CKPT_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(CKPT_PROMOTE)
#undef CKPT_LOWER_PRECISION_FP
#undef CKPT_FP32
#undef CKPT_FP32_SET_OPT_DTYPE
#undef CKPT_PROMOTE
}
}  // namespace
#endif

bool register_privateuse1_autocast() {
#if CKPT_TORCH_AT_LEAST(2, 9)
  constexpr auto key = c10::DispatchKey::AutocastPrivateUse1;
  // Operators without a policy run uncast; LibTorch may already say so itself.
  // The registrations last as long as their Library objects: kept for the process.
  static torch::Library* fallthrough = nullptr;
  static torch::Library* kernels = nullptr;
  if (kernels != nullptr) return true;
  if (!c10::Dispatcher::singleton().hasBackendFallbackForDispatchKey(key)) {
    fallthrough = new torch::Library(torch::Library::IMPL, "_", key, __FILE__, __LINE__);
    fallthrough->fallback(torch::CppFunction::makeFallthrough());
  }
  kernels = new torch::Library(torch::Library::IMPL, "aten", key, __FILE__, __LINE__);
  register_autocast_kernels(*kernels);
  return true;
#else
  return false;
#endif
}

}  // namespace compat
}  // namespace ckpt
