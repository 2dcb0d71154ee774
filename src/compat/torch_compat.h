#pragma once

// The one place that knows how the supported LibTorch releases differ (Debian's 1.13.1 and 2.x).
// Every other file calls these names and has no version test of its own.

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>
#include <c10/core/Device.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/autograd/edge.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/version.h>

#include "version.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

namespace ckpt {
namespace compat {

// ~~~ Autograd nodes ~~~

/// The owning pointer of a graph node: std::shared_ptr before 2.13, c10::intrusive_ptr since.
using NodePtr = decltype(torch::autograd::Edge::function);

/// Makes a node of type `T` owned the way this LibTorch's edges own nodes.
template <class T, class... Args>
auto make_node(Args&&... args) {
  if constexpr (std::is_same_v<NodePtr, std::shared_ptr<torch::autograd::Node>>) {
    return std::make_shared<T>(std::forward<Args>(args)...);
  } else {
    return c10::make_intrusive<T>(std::forward<Args>(args)...);
  }
}

/// A non-owning pointer to a node that tells when the node died: std::weak_ptr before 2.13,
/// c10::weak_intrusive_ptr since. `lock()` gives a NodePtr (null once the node died).
using WeakNodePtr =
    std::conditional_t<std::is_same_v<NodePtr, std::shared_ptr<torch::autograd::Node>>,
                       std::weak_ptr<torch::autograd::Node>,
                       c10::weak_intrusive_ptr<torch::autograd::Node>>;

/// A weak pointer to `node`; an expired one where no NodePtr owns it any more (the node is being
/// released).
WeakNodePtr weak_node(torch::autograd::Node& node);

/// Whether the calling thread runs a backward pass now (an autograd engine's graph task), so
/// that `Engine::queue_callback` can defer work to its end.
bool inside_backward();

/// State the autograd engine carries from the thread that starts a backward to the threads that
/// run its nodes (a device's engine thread): c10's ThreadLocalDebugInfo, in a slot of ckpt's own.
/// LibTorch versions whose slots are a closed enum (1.13) carry nothing: `carries_thread_state()`
/// is false there, `carry` does nothing and `carried` gives null.
bool carries_thread_state();
/// Makes `state` carried from the calling thread, until `stop_carrying(state)`.
void carry(std::shared_ptr<c10::DebugInfoBase> state);
/// Stops carrying `state` where it is the last one carried; else it stays until what was carried
/// after it ends (callers tell an ended state apart themselves).
void stop_carrying(const c10::DebugInfoBase* state);
/// The state carried to the calling thread last, or null.
c10::DebugInfoBase* carried();

/// Base of an autograd node that holds more than its next edges (other edges, closures, shared
/// state). Since 2.13 a node outlives its last owner while weak pointers to it remain: LibTorch
/// calls `release_resources` instead of the destructor, and a member that still owns other nodes
/// would keep them alive. `release_owned` drops such members then; before 2.13 the destructor does.
class OwningNode : public torch::autograd::Node {
 public:
  using torch::autograd::Node::Node;
#if CKPT_TORCH_AT_LEAST(2, 13)
  void release_resources() override {
    // LibTorch's part first: it calls release_variables(), which may still use the members.
    torch::autograd::Node::release_resources();
    release_owned();
  }
#endif

 protected:
  /// Drops every member that owns nodes or state. Called at most once, with no owner left.
  virtual void release_owned() = 0;
};
static_assert(CKPT_TORCH_AT_LEAST(2, 13) ==
                  std::is_base_of_v<c10::intrusive_ptr_target, torch::autograd::Node>,
              "ckpt: OwningNode's version test must match how this LibTorch owns nodes");

/// Whether a gradient accumulator has hooks that must see its gradient before it is added
/// (tensor hooks live apart from other pre-hooks since 2.0).
bool has_tensor_pre_hooks(torch::autograd::AccumulateGrad& accumulator);

/// Whether a node has hooks of any kind (tensor, pre, retain_grad, post).
bool has_hooks(torch::autograd::Node& node);

/// Whether a leaf has post-accumulate-grad hooks (2.1+, `register_post_accumulate_grad_hook`):
/// they run inside the accumulator, so its gradient must reach the accumulator itself.
bool has_post_accumulate_grad_hooks(const at::Tensor& leaf);

// ~~~ Allocators ~~~

/// Base of a CPU allocator: in 2.3 `allocate` lost its `const` and the pure virtual `copy_data`
/// appeared. Derived classes implement `allocate_bytes`.
class AllocatorBase : public c10::Allocator {
 public:
#if CKPT_TORCH_AT_LEAST(2, 3)
  c10::DataPtr allocate(size_t bytes) final {
    return allocate_bytes(bytes);
  }
#else
  c10::DataPtr allocate(size_t bytes) const final {
    return allocate_bytes(bytes);
  }
#endif
#if CKPT_TORCH_AT_LEAST(2, 3)
  void copy_data(void* dest, const void* src, std::size_t count) const final;
#endif

 protected:
  virtual c10::DataPtr allocate_bytes(size_t bytes) const = 0;
};

// ~~~ Warnings ~~~

/// The calling thread's warning handler (`c10::WarningUtils` since 2.0, `c10::Warning` before).
c10::WarningHandler* warning_handler();
void set_warning_handler(c10::WarningHandler* handler);

/// A warning handler that receives each warning's message: `process` has one signature in 1.13
/// and another in 2.x.
class MessageWarningHandler : public c10::WarningHandler {
 public:
#if CKPT_TORCH_AT_LEAST(2, 0)
  void process(const c10::Warning& warning) final {
    on_warning(warning.msg());
  }
#else
  void process(const c10::SourceLocation&, const std::string& msg, const bool) final {
    on_warning(msg);
  }
#endif

 protected:
  virtual void on_warning(const std::string& message) = 0;
};

/// While alive, drops the calling thread's warnings whose message contains `text`, and passes
/// the others on to the handler that was there.
class WarningFilter : public c10::WarningHandler {
 public:
  explicit WarningFilter(std::string text);
  ~WarningFilter() override;
  WarningFilter(const WarningFilter&) = delete;
  WarningFilter& operator=(const WarningFilter&) = delete;
#if CKPT_TORCH_AT_LEAST(2, 0)
  void process(const c10::Warning& warning) override;
#else
  void process(const c10::SourceLocation& source_location, const std::string& msg,
               const bool verbatim) override;
#endif

 private:
  std::string text_;
  c10::WarningHandler* previous_;
};

// ~~~ Devices: RNG, autocast, memory ~~~

/// Whether the runtime of an accelerator type has been started in this process. 2.x asks the
/// device-generic accelerator hooks (CUDA, XPU, MPS, HPU, MTIA, PrivateUse1, ...); 1.13 knows CUDA.
bool device_initialized(c10::DeviceType type);

/// The accelerator type LibTorch uses by default when one is available at run time, as Python's
/// `torch.accelerator.current_accelerator(check_available=True)`: 2.x asks `at::getAccelerator()`
/// (a registered PrivateUse1 backend first, then CUDA, XPU, ...); 1.13 knows CUDA.
c10::optional<c10::DeviceType> current_accelerator();

/// The default random generator of `device` (CPU or any accelerator this LibTorch has hooks for).
at::Generator default_generator(c10::Device device);

/// Whether autocast has a state for `type` in this LibTorch (2.x: every type autocast supports;
/// 1.13: CPU and CUDA).
bool autocast_available(c10::DeviceType type);
bool autocast_enabled(c10::DeviceType type);
void set_autocast_enabled(c10::DeviceType type, bool enabled);
c10::ScalarType autocast_dtype(c10::DeviceType type);
void set_autocast_dtype(c10::DeviceType type, c10::ScalarType dtype);

/// Waits for the work queued on `device`'s current stream (nothing to wait for on the CPU), so
/// that host clocks time what the device did.
void synchronize(c10::Device device);

/// Waits for the work queued on every stream of `device` (before LibTorch 2.9, whose interface
/// has no such call, on its current stream only).
void synchronize_device(c10::Device device);

/// Bytes held by live tensors on an accelerator, from its caching allocator's statistics.
struct DeviceMemoryStats {
  int64_t allocated_bytes = 0;
  int64_t peak_allocated_bytes = 0;
};

/// Whether `device_memory_stats` can measure devices of this type here (2.9+: every accelerator
/// whose allocator keeps statistics; 1.13 and earlier 2.x: none).
bool device_memory_measurable(c10::DeviceType type);

/// The caching allocator's statistics for `device`. Raises a clear error where they can't be read.
DeviceMemoryStats device_memory_stats(c10::Device device);

/// Starts the device allocator's high-water mark again at what is allocated now.
void reset_device_peak(c10::Device device);

}  // namespace compat
}  // namespace ckpt
