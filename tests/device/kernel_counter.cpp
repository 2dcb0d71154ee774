#include "kernel_counter.h"

#include "compat/version.h"
#include "emulated_device/fallback.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>

#include <map>
#include <mutex>

namespace ckpt {
namespace test {
namespace {

// The kernel each wrapped operator had before the counter took its place, and the count.
struct Wrapped {
  c10::DispatchKey key;
  std::function<void(const c10::OperatorHandle&, c10::DispatchKeySet, torch::jit::Stack*)> kernel;
};
std::mutex g_mutex;
std::map<std::string, Wrapped> g_wrapped;  // by operator name
std::atomic<int64_t> g_calls{0};

void counting_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                     torch::jit::Stack* stack) {
  ++g_calls;
  Wrapped wrapped;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    wrapped = g_wrapped.at(op.operator_name().name);
  }
  wrapped.kernel(op, keys, stack);
}

c10::DispatchKey backend_key(c10::DeviceType type) {
  return type == c10::DeviceType::CUDA ? c10::DispatchKey::CUDA : c10::DispatchKey::PrivateUse1;
}

// The kernel that runs for `op` on `type` now.
Wrapped current_kernel(const c10::OperatorHandle& op, c10::DeviceType type) {
  const c10::DispatchKey key = backend_key(type);
  if (type == c10::DeviceType::PrivateUse1) {
    // The emulated device runs these operators through its fallback, on every LibTorch.
    return {key, [](const c10::OperatorHandle& o, c10::DispatchKeySet, torch::jit::Stack* s) {
              emulated_device::detail::cpu_fallback(o, s);
            }};
  }
#if CKPT_TORCH_AT_LEAST(2, 9)
  auto kernel = op.getComputedKernelForDispatchKey(key);
  return {key, [kernel](const c10::OperatorHandle& o, c10::DispatchKeySet keys,
                        torch::jit::Stack* s) { kernel.callBoxed(o, keys, s); }};
#else
  TORCH_CHECK(false, "KernelCounter: LibTorch ", TORCH_VERSION, " can't wrap ", type, " kernels");
#endif
}

}  // namespace

bool KernelCounter::available(c10::DeviceType type) {
  return type == c10::DeviceType::PrivateUse1 || CKPT_TORCH_AT_LEAST(2, 9);
}

KernelCounter::KernelCounter(c10::DeviceType type, const std::vector<std::string>& ops) {
  g_calls = 0;
  library_ = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", backend_key(type),
                                              __FILE__, __LINE__);
  for (const auto& name : ops) {
    TORCH_CHECK(name.rfind("aten::", 0) == 0, "KernelCounter: aten operators only, got ", name);
    const auto op = c10::Dispatcher::singleton().findOp({name, ""});
    if (!op) continue;  // not in this LibTorch
    {
      std::lock_guard<std::mutex> lock(g_mutex);
      g_wrapped[op->operator_name().name] = current_kernel(*op, type);
    }
    library_->impl(name.substr(6).c_str(),
                   torch::CppFunction::makeFromBoxedFunction<&counting_kernel>());
  }
}

KernelCounter::~KernelCounter() {
  library_.reset();  // the wrapped kernels are back
  std::lock_guard<std::mutex> lock(g_mutex);
  g_wrapped.clear();
}

int64_t KernelCounter::calls() const {
  return g_calls.load();
}

}  // namespace test
}  // namespace ckpt
