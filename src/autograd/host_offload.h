#pragma once

// Moving saved tensors to host memory and back: one home for the copies, their stream and their
// events, used by offloaded regions, the offload guard and selective offloading.
//
// Copies run on one side stream per device, so that they overlap the compute on the current
// stream: a copy to the host first waits for the work that made its tensor, and a copy back is
// waited for only by the stream that reads it, when it reads it.

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Event.h>
#include <c10/core/Storage.h>
#include <c10/core/Stream.h>
#include <c10/util/Optional.h>
#include <torch/csrc/autograd/saved_variable_hooks.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace ckpt {
namespace detail {

/// The stream offloading copies of `device` run on (one per device, from the device's pool).
c10::Stream offload_stream(c10::Device device);

/// Host memory held by offloaded data in this process, and its high-water mark.
int64_t offloaded_host_bytes();
int64_t offloaded_host_peak_bytes();
void reset_offloaded_host_peak();

/// Where and how a tensor lies in its storage, to make it again on another copy of the storage.
struct StorageView {
  explicit StorageView(const at::Tensor& tensor);
  at::Tensor on(const c10::Storage& storage) const;

  std::vector<int64_t> sizes, strides;
  int64_t offset = 0;
  caffe2::TypeMeta dtype;
  bool conj = false, neg = false;  // a lazy conjugate or negative view's bits
};

/// The offloaded data of one scope (an offloaded region's forward, an `OffloadGuard`): each
/// storage copied to host memory once, however many saved tensors share it, and brought back to
/// the device when the backward first asks for any of them, all at once and in the order they
/// will be read in.
class OffloadGroup {
 public:
  /// `pin_memory`: host copies of CUDA data go to pinned memory (other devices: pageable).
  /// `last_first`: the copies back start with the data offloaded last (a backward's order);
  /// false: with the data offloaded first (a recompute's order).
  explicit OffloadGroup(bool pin_memory, bool last_first = true)
      : pin_memory_(pin_memory), last_first_(last_first) {}
  ~OffloadGroup();
  OffloadGroup(const OffloadGroup&) = delete;
  OffloadGroup& operator=(const OffloadGroup&) = delete;

  /// The data of `tensors` stays on the device (an offloaded region's arguments, which the caller
  /// holds): what the scope saves of it is used where it is, never copied. Before any `add`.
  void keep_on_device(const std::vector<at::Tensor>& tensors);
  /// Starts the copy of `tensor`'s storage (an accelerator's) to the host, unless it is in the
  /// group already; one more user of it either way. Returns its slot. `if_let_go`: the copy
  /// waits for the forward's end, and is made only if nothing else holds the data then (a frozen
  /// parameter, the caller's batch stay on the device anyway: a copy would only double them).
  size_t add(const at::Tensor& tensor, bool if_let_go = false);
  /// The end of the forward: the current streams wait for the copies to the host, and the group
  /// lets go of the device data (what else holds it keeps it). The data of `resident` tensors
  /// (the scope's results, which stay on the device for what comes next) is used where it is:
  /// its host copy goes.
  void finish_forward(const std::vector<at::Tensor>& resident = {});
  /// Starts bringing every slot back to its device (once; later calls do nothing).
  void prefetch();
  /// The data of `slot` on the device, once its copy back has landed for the current stream.
  /// Prefetches first.
  c10::Storage fetch(size_t slot);
  /// One user of `slot` is gone; the slot's copies go with its last user.
  void release(size_t slot);
  /// Bytes the group holds in host memory.
  int64_t host_bytes() const;

  /// What a slot holds, for reports.
  struct SlotState {
    const c10::StorageImpl* data = nullptr;  // the forward's data, to match (null: dropped)
    c10::Device where{c10::DeviceType::CPU};
    int64_t host_bytes = 0;  // its host copy's (0: it stays on the device)
  };
  /// Every slot's state; after `finish_forward`, where each slot's data ended up.
  std::vector<SlotState> slot_states() const;

 private:
  struct Slot {
    c10::Storage device;  // the forward's data, until finish_forward
    at::Tensor host;      // bytes
    std::unique_ptr<c10::Event> copied;
    c10::Storage fetched;  // the data back on the device
    std::unique_ptr<c10::Event> fetched_event;
    c10::Device where{c10::DeviceType::CPU};
    const c10::StorageImpl* data = nullptr;  // identity only: `device` goes at the forward's end
    int users = 0;
    bool resident = false;   // `device` stays: nothing to bring back
    bool if_let_go = false;  // copied at the forward's end, if only the group holds it then
  };
  void start_copy(Slot& slot);
  void prefetch_locked();
  void fetch_slot(Slot& slot);
  void drop_locked(Slot& slot);  // frees the slot's copies

  const bool pin_memory_;
  const bool last_first_;
  mutable std::mutex mutex_;
  std::vector<Slot> slots_;
  std::unordered_map<const c10::StorageImpl*, size_t> index_;  // during the forward
  bool forward_done_ = false;
  bool prefetched_ = false;
  int64_t host_bytes_ = 0;
};

/// The saved-tensor hooks of offloading: a tensor on an accelerator goes to `group`; anything else
/// (host data, parameters and other leaves that require grad, which stay on the device anyway)
/// is kept as it is. A tensor that requires no grad goes only if nothing else holds it at the end
/// of the forward (a mask goes; a frozen parameter or the batch stays: issue 45, item 8).
/// Autograd checks no versions of tensors with hooks, so these hooks do.
std::unique_ptr<torch::autograd::SavedVariableHooks> offload_hooks(
    std::shared_ptr<OffloadGroup> group);

}  // namespace detail
}  // namespace ckpt
