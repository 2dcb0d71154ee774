#include "dispatch_mode.h"

#include <c10/util/Exception.h>
#include <torch/library.h>

#include <memory>
#include <mutex>
#include <vector>

namespace ckpt {
namespace detail {
namespace {

constexpr c10::DispatchKey kModeKey = c10::DispatchKey::Fake;

// This thread's modes, innermost last.
thread_local std::vector<DispatchMode*> modes;

// The innermost mode handles the call with itself popped: what it runs goes to the next mode,
// or, with none left, past the mode key to the kernels.
void mode_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (modes.empty()) {  // the key leaked into a state without a mode (it should not): just run
    const c10::impl::ExcludeDispatchKeyGuard off(kModeKey);
    op.callBoxed(stack);
    return;
  }
  DispatchMode* mode = modes.back();
  modes.pop_back();
  struct Restore {
    DispatchMode* mode;
    ~Restore() { modes.push_back(mode); }
  } restore{mode};
  std::optional<c10::impl::ExcludeDispatchKeyGuard> off;
  if (modes.empty()) off.emplace(kModeKey);
  mode->dispatch(op, stack);
}

}  // namespace

DispatchModesOff::DispatchModesOff() : off_(kModeKey) {}

namespace {

// Registered once, on first use, and kept for the process (a static library has no other safe
// moment to register: a static initialiser would not run unless something references it).
void install_fallback() {
  static std::once_flag once;
  static std::unique_ptr<torch::Library> library;
  std::call_once(once, [] {
    TORCH_CHECK(!c10::Dispatcher::singleton().hasBackendFallbackForDispatchKey(kModeKey),
                "ckpt: selective checkpointing needs the dispatch key ", kModeKey,
                " for its operator interception, but another library registered a fallback "
                "for it. Use checkpointing without a policy.");
    library =
        std::make_unique<torch::Library>(torch::Library::IMPL, "_", kModeKey, __FILE__, __LINE__);
    library->fallback(torch::CppFunction::makeFromBoxedFunction<&mode_fallback>());
  });
}

}  // namespace

bool dispatch_mode_active() {
  return !modes.empty() && c10::impl::tls_is_dispatch_key_included(kModeKey) &&
         !c10::impl::tls_is_dispatch_key_excluded(kModeKey);
}

DispatchModeGuard::DispatchModeGuard(DispatchMode& mode) {
  install_fallback();
  modes.push_back(&mode);
  include_.emplace(kModeKey);
}

DispatchModeGuard::~DispatchModeGuard() {
  include_.reset();
  modes.pop_back();
}

}  // namespace detail
}  // namespace ckpt
