#include "torch_compat.h"

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/variable.h>

#if CKPT_TORCH_AT_LEAST(2, 3)
#include <ATen/DeviceAccelerator.h>
#else
#include <ATen/detail/CUDAHooksInterface.h>
#endif
#if CKPT_TORCH_AT_LEAST(2, 9)
#include <c10/core/CachingDeviceAllocator.h>
#endif

#include <cstring>
#include <string_view>

namespace ckpt {
namespace compat {
namespace {

// LibTorch 2.x keeps tensor hooks apart from other pre-hooks; 1.13 has only pre_hooks().
template <class N>
auto any_tensor_pre_hooks(N& node, int) -> decltype(node.tensor_pre_hooks(), bool()) {
  return !node.tensor_pre_hooks().empty() || !node.pre_hooks().empty();
}
template <class N>
bool any_tensor_pre_hooks(N& node, long) {
  return !node.pre_hooks().empty();
}

// retain_grad()'s hooks live apart since 2.0.
template <class N>
auto any_retains_grad_hooks(N& node, int) -> decltype(node.retains_grad_hooks(), bool()) {
  return !node.retains_grad_hooks().empty();
}
template <class N>
bool any_retains_grad_hooks(N& /*node*/, long) {
  return false;
}

}  // namespace

WeakNodePtr weak_node(torch::autograd::Node& node) {
#if CKPT_TORCH_AT_LEAST(2, 13)
  // A node whose last owner is gone is being released (LibTorch calls release_variables then):
  // reclaiming it would own it once more and release it a second time, inside the first.
  if (c10::raw::intrusive_ptr::use_count(&node) == 0) {
    return c10::weak_intrusive_ptr<torch::autograd::Node>(
        c10::intrusive_ptr<torch::autograd::Node>());
  }
  return c10::weak_intrusive_ptr<torch::autograd::Node>(
      c10::intrusive_ptr<torch::autograd::Node>::unsafe_reclaim_from_nonowning(&node));
#else
  return node.weak_from_this();
#endif
}

namespace {

// ThreadLocalDebugInfo's slots: a closed enum in older LibTorch (1.13), where nothing is carried;
// in newer ones (2.15) a type made from the address of a name, so that a library has its own.
constexpr std::string_view kCarriedSlotName = "ckpt";

template <typename Kind, bool = std::is_enum_v<Kind>>
struct CarriedSlot {
  static constexpr bool available = false;
  static void push(std::shared_ptr<c10::DebugInfoBase> /*state*/) {}
  static void pop(const c10::DebugInfoBase* /*state*/) {}
  static c10::DebugInfoBase* get() { return nullptr; }
};

template <typename Kind>
struct CarriedSlot<Kind, false> {
  static constexpr bool available = true;
  static Kind kind() {
    static const Kind slot(&kCarriedSlotName);
    return slot;
  }
  static void push(std::shared_ptr<c10::DebugInfoBase> state) {
    c10::ThreadLocalDebugInfo::_push(kind(), std::move(state));
  }
  static void pop(const c10::DebugInfoBase* state) {
    if (get() != state) return;
    try {
      c10::ThreadLocalDebugInfo::_pop(kind());  // throws where another slot was pushed after it
    } catch (const c10::Error&) {
    }
  }
  static c10::DebugInfoBase* get() { return c10::ThreadLocalDebugInfo::get(kind()); }
};

using Carried = CarriedSlot<c10::DebugInfoKind>;

}  // namespace

bool carries_thread_state() {
  return Carried::available;
}

void carry(std::shared_ptr<c10::DebugInfoBase> state) {
  Carried::push(std::move(state));
}

void stop_carrying(const c10::DebugInfoBase* state) {
  Carried::pop(state);
}

c10::DebugInfoBase* carried() {
  return Carried::get();
}

bool inside_backward() {
  return torch::autograd::get_current_graph_task_exec_info() != nullptr;
}

bool has_tensor_pre_hooks(torch::autograd::AccumulateGrad& accumulator) {
  return any_tensor_pre_hooks(accumulator, 0);
}

bool has_hooks(torch::autograd::Node& node) {
  // An accumulator reads its tensor hooks from its leaf, which may be gone (then it has none, and
  // asking would throw inside a noexcept accessor).
  const auto* accumulator = dynamic_cast<torch::autograd::AccumulateGrad*>(&node);
  const bool pre_hooks = accumulator != nullptr && !accumulator->variable.defined()
                             ? !node.pre_hooks().empty()
                             : any_tensor_pre_hooks(node, 0);
  return pre_hooks || any_retains_grad_hooks(node, 0) || !node.post_hooks().empty();
}

bool has_post_accumulate_grad_hooks(const at::Tensor& leaf) {
#if CKPT_TORCH_AT_LEAST(2, 1)
  return torch::autograd::impl::post_acc_grad_hooks(leaf) != nullptr;
#else
  (void)leaf;
  return false;
#endif
}

#if CKPT_TORCH_AT_LEAST(2, 3)
void AllocatorBase::copy_data(void* dest, const void* src, std::size_t count) const {
  std::memcpy(dest, src, count);
}
#endif

c10::WarningHandler* warning_handler() {
#if CKPT_TORCH_AT_LEAST(2, 0)
  return c10::WarningUtils::get_warning_handler();
#else
  return c10::Warning::get_warning_handler();
#endif
}

void set_warning_handler(c10::WarningHandler* handler) {
#if CKPT_TORCH_AT_LEAST(2, 0)
  c10::WarningUtils::set_warning_handler(handler);
#else
  c10::Warning::set_warning_handler(handler);
#endif
}

WarningFilter::WarningFilter(std::string text)
    : text_(std::move(text)), previous_(warning_handler()) {
  set_warning_handler(this);
}

WarningFilter::~WarningFilter() {
  set_warning_handler(previous_);
}

#if CKPT_TORCH_AT_LEAST(2, 0)
void WarningFilter::process(const c10::Warning& warning) {
  if (warning.msg().find(text_) == std::string::npos) previous_->process(warning);
}
#else
void WarningFilter::process(const c10::SourceLocation& source_location, const std::string& msg,
                            const bool verbatim) {
  if (msg.find(text_) == std::string::npos) previous_->process(source_location, msg, verbatim);
}
#endif

bool device_initialized(c10::DeviceType type) {
  if (type == c10::DeviceType::CPU) return false;
#if CKPT_TORCH_AT_LEAST(2, 3)
  // A type without hooks in this build (XPU in a CUDA build, say) has no runtime to start.
  if (!at::accelerator::isAccelerator(type)) return false;
  const auto& hooks = at::globalContext().getAcceleratorHooksInterface(type);
  if (!hooks.isAvailable()) return false;
  for (c10::DeviceIndex index = 0; index < hooks.deviceCount(); ++index) {
    if (hooks.hasPrimaryContext(index)) return true;
  }
  return false;
#else
  if (type != c10::DeviceType::CUDA || !at::hasCUDA()) return false;
  const auto& hooks = at::detail::getCUDAHooks();
  for (int64_t index = 0; index < hooks.getNumGPUs(); ++index) {
    if (hooks.hasPrimaryContext(index)) return true;
  }
  return false;
#endif
}

c10::optional<c10::DeviceType> current_accelerator() {
#if CKPT_TORCH_AT_LEAST(2, 3)
  const auto type = at::accelerator::getAccelerator(/*checked=*/false);
#else
  const c10::optional<c10::DeviceType> type =
      at::hasCUDA() ? c10::make_optional(c10::DeviceType::CUDA) : c10::nullopt;
#endif
  // Available at run time: its devices are there (a CUDA build on a machine without a GPU has
  // none).
  if (!type || c10::impl::getDeviceGuardImpl(*type)->deviceCount() == 0) return c10::nullopt;
  return *type;
}

at::Generator default_generator(c10::Device device) {
  return at::globalContext().defaultGenerator(device);
}

void synchronize(c10::Device device) {
  if (device.is_cpu() || device.is_meta()) return;
  const auto* guard = c10::impl::getDeviceGuardImpl(device.type());
  guard->synchronizeStream(guard->getStream(device));
}

void synchronize_device(c10::Device device) {
#if CKPT_TORCH_AT_LEAST(2, 9)
  if (device.is_cpu() || device.is_meta()) return;
  c10::impl::getDeviceGuardImpl(device.type())->synchronizeDevice(device.index());
#else
  synchronize(device);
#endif
}

bool autocast_available(c10::DeviceType type) {
#if CKPT_TORCH_AT_LEAST(2, 4)
  return at::autocast::is_autocast_available(type);
#else
  return type == c10::DeviceType::CPU || type == c10::DeviceType::CUDA;
#endif
}

// LibTorch 2.4 replaced the per-device autocast functions with device-generic ones.
#if CKPT_TORCH_AT_LEAST(2, 4)
bool autocast_enabled(c10::DeviceType type) {
  return at::autocast::is_autocast_enabled(type);
}
void set_autocast_enabled(c10::DeviceType type, bool enabled) {
  at::autocast::set_autocast_enabled(type, enabled);
}
c10::ScalarType autocast_dtype(c10::DeviceType type) {
  return at::autocast::get_autocast_dtype(type);
}
void set_autocast_dtype(c10::DeviceType type, c10::ScalarType dtype) {
  at::autocast::set_autocast_dtype(type, dtype);
}
#else
bool autocast_enabled(c10::DeviceType type) {
  return type == c10::DeviceType::CPU ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
}
void set_autocast_enabled(c10::DeviceType type, bool enabled) {
  if (type == c10::DeviceType::CPU) {
    at::autocast::set_cpu_enabled(enabled);
  } else {
    at::autocast::set_enabled(enabled);
  }
}
c10::ScalarType autocast_dtype(c10::DeviceType type) {
  return type == c10::DeviceType::CPU ? at::autocast::get_autocast_cpu_dtype()
                                      : at::autocast::get_autocast_gpu_dtype();
}
void set_autocast_dtype(c10::DeviceType type, c10::ScalarType dtype) {
  if (type == c10::DeviceType::CPU) {
    at::autocast::set_autocast_cpu_dtype(dtype);
  } else {
    at::autocast::set_autocast_gpu_dtype(dtype);
  }
}
#endif

namespace {

#if CKPT_TORCH_AT_LEAST(2, 9)
// The accelerator's allocator when it keeps statistics; null otherwise (no allocator registered
// for the type in this build, or one that is not a caching device allocator).
c10::DeviceAllocator* statistics_allocator(c10::DeviceType type) {
  if (type == c10::DeviceType::CPU || !at::accelerator::isAccelerator(type)) return nullptr;
  try {
    return dynamic_cast<c10::DeviceAllocator*>(c10::GetAllocator(type));
  } catch (const c10::Error&) {
    return nullptr;
  }
}
#endif

}  // namespace

bool device_memory_measurable(c10::DeviceType type) {
#if CKPT_TORCH_AT_LEAST(2, 9)
  return statistics_allocator(type) != nullptr;
#else
  (void)type;
  return false;
#endif
}

namespace {
void check_measurable(c10::Device device) {
  TORCH_CHECK(device_memory_measurable(device.type()), "ckpt: the memory of ", device,
              " can't be measured with LibTorch ", TORCH_VERSION,
              ": device memory is read from the caching allocator's statistics through the "
              "device-generic allocator API of LibTorch 2.9 and later. Measure on the CPU, or "
              "build ckpt against a newer LibTorch.");
  const auto count = c10::impl::getDeviceGuardImpl(device.type())->deviceCount();
  TORCH_CHECK(device.index() >= 0 && device.index() < count, "ckpt: ", device,
              " is not present: this machine has ", static_cast<int>(count), " ",
              c10::DeviceTypeName(device.type()), " device(s).");
#if CKPT_TORCH_AT_LEAST(2, 9)
  // CUDA's caching allocator has no statistics before its runtime starts (the first tensor on the
  // device starts it): reading them first is an error.
  at::globalContext().lazyInitDevice(device.type());
#endif
}
}  // namespace

DeviceMemoryStats device_memory_stats(c10::Device device) {
  check_measurable(device);
#if CKPT_TORCH_AT_LEAST(2, 9)
  const auto stats = statistics_allocator(device.type())->getDeviceStats(device.index());
  const auto& all =
      stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
  return {all.current, all.peak};
#else
  return {};
#endif
}

void reset_device_peak(c10::Device device) {
  check_measurable(device);
#if CKPT_TORCH_AT_LEAST(2, 9)
  statistics_allocator(device.type())->resetPeakStats(device.index());
#endif
}

}  // namespace compat
}  // namespace ckpt
