#include "saved_tensor_hooks.h"

#include <c10/util/Exception.h>
#include <torch/csrc/autograd/engine.h>

#include <mutex>
#include <utility>

namespace ckpt {
namespace detail {
namespace {

thread_local SavedHooksFactory current_factory;

// LibTorch's engine, but for the default hooks: Python's engine is the same kind of subclass.
class HookingEngine final : public torch::autograd::Engine {
 public:
  std::unique_ptr<torch::autograd::SavedVariableHooks> get_default_saved_variable_hooks() override {
    return current_factory ? current_factory() : nullptr;
  }

  // Starts the threads of the devices. LibTorch 1.13 starts an engine's threads once per engine;
  // later versions once per process, so there the base engine may have taken the turn already.
  void start() {
    initialize_device_threads_pool();
    if (device_ready_queues_.empty()) start_device_threads();
  }
};

HookingEngine& hooking_engine_instance() {
  // Never destroyed: the engine's threads outlive static destruction, as LibTorch's own engine's.
  static auto* engine = new HookingEngine();
  return *engine;
}

torch::autograd::Engine& hooking_engine() {
  return hooking_engine_instance();
}

void install_engine() {
  static std::once_flag once;
  std::call_once(once, [] {
    using torch::autograd::Engine;
    TORCH_CHECK(&Engine::get_default_engine() == &Engine::get_base_engine(),
                "ckpt: offloading needs saved-tensor hooks in C++, which take LibTorch's own "
                "autograd engine, but this process runs another one (Python's, once torch's "
                "Python bindings are loaded). From Python, use torch.autograd.graph.save_on_cpu.");
    hooking_engine_instance().start();
    torch::autograd::set_default_engine_stub(&hooking_engine);
  });
  TORCH_CHECK(&torch::autograd::Engine::get_default_engine() == &hooking_engine(),
              "ckpt: another library replaced LibTorch's default autograd engine after ckpt "
              "installed its own; offloading needs ckpt's.");
}

}  // namespace

SavedTensorHooksScope::SavedTensorHooksScope(SavedHooksFactory factory) {
  if (factory) install_engine();
  previous_ = std::exchange(current_factory, std::move(factory));
}

SavedTensorHooksScope::~SavedTensorHooksScope() {
  current_factory = std::move(previous_);
}

bool saved_tensor_hooks_active() {
  return static_cast<bool>(current_factory);
}

bool saved_tensor_hooks_available() {
  const torch::autograd::Engine* engine = &torch::autograd::Engine::get_default_engine();
  return engine == &torch::autograd::Engine::get_base_engine() || engine == &hooking_engine();
}

}  // namespace detail
}  // namespace ckpt
