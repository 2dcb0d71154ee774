#include "saved_tensor_hooks.h"

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/csrc/autograd/variable.h>

#include <mutex>
#include <unordered_map>
#include <utility>

namespace ckpt {
namespace detail {
struct SavedLeafTally::Counts {
  void add(const torch::autograd::Node* accumulator, long delta) {
    const std::lock_guard<std::mutex> lock(mutex);
    holders[accumulator] += delta;
  }
  long of(const torch::autograd::Node* accumulator) const {
    const std::lock_guard<std::mutex> lock(mutex);
    const auto found = holders.find(accumulator);
    return found == holders.end() ? 0 : found->second;
  }
  // Saved variables may go on the engine's threads.
  mutable std::mutex mutex;
  std::unordered_map<const torch::autograd::Node*, long> holders;
};

namespace {

thread_local SavedHooksFactory current_factory;
thread_local std::shared_ptr<SavedLeafTally::Counts> current_tally;

// Whether a saved variable of a leaf holds the leaf's accumulator under hooks: tried once, on a
// leaf of its own, as LibTorch's versions differ. Asked while ckpt's hooks pack (its engine is
// in place); the trial's own saved variable is counted in no tally.
bool saved_leaves_hold_accumulators();

// Counts each leaf it packs into a tally while its saved variable lives, and hands everything to
// the hooks it wraps.
class TallyingHooks final : public torch::autograd::SavedVariableHooks {
 public:
  TallyingHooks(std::unique_ptr<torch::autograd::SavedVariableHooks> inner,
                std::shared_ptr<SavedLeafTally::Counts> tally)
      : inner_(std::move(inner)), tally_(std::move(tally)) {}
  ~TallyingHooks() override {
    if (accumulator_ != nullptr) tally_->add(accumulator_, -1);
  }
  void call_pack_hook(const at::Tensor& tensor) override {
    if (tensor.is_leaf() && tensor.requires_grad() && saved_leaves_hold_accumulators()) {
      accumulator_ = torch::autograd::impl::try_get_grad_accumulator(tensor).get();
      tally_->add(accumulator_, 1);
    }
    inner_->call_pack_hook(tensor);
  }
  at::Tensor call_unpack_hook() override { return inner_->call_unpack_hook(); }

 private:
  std::unique_ptr<torch::autograd::SavedVariableHooks> inner_;
  std::shared_ptr<SavedLeafTally::Counts> tally_;
  const torch::autograd::Node* accumulator_ = nullptr;
};

class KeepingHooks final : public torch::autograd::SavedVariableHooks {
 public:
  void call_pack_hook(const at::Tensor& tensor) override { kept_ = tensor; }
  at::Tensor call_unpack_hook() override { return kept_; }

 private:
  at::Tensor kept_;
};

// LibTorch's engine, but for the default hooks: Python's engine is the same kind of subclass.
class HookingEngine final : public torch::autograd::Engine {
 public:
  std::unique_ptr<torch::autograd::SavedVariableHooks> get_default_saved_variable_hooks() override {
    if (!current_factory) return nullptr;
    auto hooks = current_factory();
    if (hooks && current_tally)
      return std::make_unique<TallyingHooks>(std::move(hooks), current_tally);
    return hooks;
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

bool saved_leaves_hold_accumulators() {
  static const bool holds = [] {
    auto tally = std::exchange(current_tally, nullptr);
    const at::Tensor leaf = at::empty({1}).requires_grad_(true);
    const auto accumulator = torch::autograd::impl::grad_accumulator(leaf);
    const auto before = accumulator.use_count();
    bool more = false;
    {
      const SavedTensorHooksScope scope([] { return std::make_unique<KeepingHooks>(); });
      const torch::autograd::SavedVariable saved(leaf, /*is_output=*/false);
      more = accumulator.use_count() > before;
    }
    current_tally = std::move(tally);
    return more;
  }();
  return holds;
}

}  // namespace

SavedTensorHooksScope::SavedTensorHooksScope(SavedHooksFactory factory) {
  if (factory) install_engine();
  previous_ = std::exchange(current_factory, std::move(factory));
}

SavedTensorHooksScope::~SavedTensorHooksScope() {
  current_factory = std::move(previous_);
}

SavedLeafTally::SavedLeafTally() : counts_(std::make_shared<Counts>()) {}

SavedLeafTally::Recording::Recording(const SavedLeafTally& tally)
    : previous_(std::exchange(current_tally, tally.counts_)) {}

SavedLeafTally::Recording::~Recording() {
  current_tally = std::move(previous_);
}

long SavedLeafTally::holders_of(const torch::autograd::Node* accumulator) const {
  return counts_->of(accumulator);
}

void SavedVersion::note(const at::Tensor& tensor) {
  counter_ = tensor.unsafeGetTensorImpl()->version_counter();
  if (counter_.enabled()) version_ = counter_.current_version();
}

void SavedVersion::check(const char* by) const {
  TORCH_CHECK(!counter_.enabled() || counter_.current_version() == version_,
              "one of the variables needed for gradient computation has been modified by an "
              "inplace operation",
              by, ": it is at version ", counter_.current_version(), "; expected version ",
              version_, " instead. Don't modify a tensor in place after an operator saved it.");
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
