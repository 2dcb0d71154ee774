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

/// While it lives, keeps the most host memory offloaded data held at once in this process (as
/// `offloaded_host_bytes` counts it, whichever thread offloads) since it began or since the last
/// `restart()`, without moving the process's high-water mark, which a user may be reading. An
/// offloaded region's copies of its results are held until its forward ends, so the host memory
/// its forward reaches is more than what it leaves held.
class HostHighWater {
 public:
  HostHighWater();
  ~HostHighWater();
  HostHighWater(const HostHighWater&) = delete;
  HostHighWater& operator=(const HostHighWater&) = delete;

  /// The most held at once since the last restart (or construction); starts again from what is
  /// held now.
  int64_t restart();

  /// Called with the bytes held after each change while some watcher lives.
  static void note(int64_t held);

 private:
  int64_t high_;  // under the watchers' mutex
};
/// For tests: host copies of every device's data ask for pinned memory, as CUDA's do. Where there
/// is no CUDA that fails, as pinning may on a GPU machine, and the fall-back runs.
void pin_every_device_for_testing(bool pin);
/// Host memory the pool of offloading's host buffers holds for reuse, and emptying it.
int64_t pooled_host_bytes();
void empty_host_pool();

/// Where and how a tensor lies in its storage, to make it again on another copy of the storage.
struct StorageView {
  explicit StorageView(const at::Tensor& tensor);
  at::Tensor on(const c10::Storage& storage) const;

  std::vector<int64_t> sizes, strides;
  int64_t offset = 0;
  caffe2::TypeMeta dtype;
  bool conj = false, neg = false;  // a lazy conjugate or negative view's bits
};

/// How a group moves its data (OffloadOptions, less what the region layer decides).
struct OffloadSettings {
  bool pin_memory = true;  // host copies of CUDA data in pinned memory (other devices: pageable)
  /// true: the copies back start with the data offloaded last (a backward's order); false: with
  /// the data offloaded first (a recompute's order).
  bool last_first = true;
  /// The group joins its thread's chain of groups (see `ManualOffloadScope`): the look-ahead and
  /// `keep_last` below apply to it. Selective offloading's groups stay out.
  bool in_chain = true;
  int look_ahead = 0;            // groups before this one to bring back during its backward
  int64_t max_ahead_bytes = -1;  // beyond what its backward let go of (-1: whole groups at once)
  int keep_last = 0;             // this group keeps its device data while it is this recent
  int64_t min_bytes = 0;         // smaller storages stay on the device
};

/// The offloaded data of one scope (an offloaded region's forward, an `OffloadGuard`): each
/// storage copied to host memory once, however many saved tensors share it, and brought back to
/// the device when the backward first asks for any of them, all at once and in the order they
/// will be read in.
///
/// Groups that finish their forward on one thread form its chain, newest last. Once a group's
/// backward has begun, it brings back the `look_ahead` groups before it in the chain (the ones
/// the backward reaches next), slot by slot in the order their backwards read them, as it lets go
/// of its own device memory, one release behind (plus `max_ahead_bytes`): their copies run during
/// its backward instead of in front of their own, and the device holds no more than without them.
/// The `keep_last` newest groups keep their device data until newer ones finish: the backward
/// starts with them, and has nothing to wait for.
class OffloadGroup : public std::enable_shared_from_this<OffloadGroup> {
 public:
  explicit OffloadGroup(const OffloadSettings& settings) : settings_(settings) {}
  ~OffloadGroup();
  OffloadGroup(const OffloadGroup&) = delete;
  OffloadGroup& operator=(const OffloadGroup&) = delete;

  /// The data of `tensors` stays on the device (an offloaded region's arguments, which the caller
  /// holds): what the scope saves of it is used where it is, never copied. Before any `add`.
  void keep_on_device(const std::vector<at::Tensor>& tensors);
  /// Whether `add` takes `tensor`: an accelerator's strided data of at least `min_bytes`.
  bool takes(const at::Tensor& tensor) const;
  /// Starts the copy of `tensor`'s storage (an accelerator's) to the host, unless it is in the
  /// group already; one more user of it either way. Returns its slot. `if_let_go`: the copy
  /// waits for the forward's end, and is made only if nothing else holds the data then (a frozen
  /// parameter, the caller's batch stay on the device anyway: a copy would only double them).
  size_t add(const at::Tensor& tensor, bool if_let_go = false);
  /// The end of the forward: the current streams wait for the copies to the host, and the group
  /// lets go of the device data (what else holds it keeps it), unless `keep_last` keeps it for
  /// now. The data of `resident` tensors (the scope's results, which stay on the device for what
  /// comes next) is used where it is: its host copy goes. The group joins its thread's chain.
  void finish_forward(const std::vector<at::Tensor>& resident = {});
  /// Starts bringing every slot back to its device (once; later calls do nothing). Does not
  /// look ahead. Returns the bytes it brings back.
  int64_t prefetch();
  /// Starts bringing slots back ahead of the group's backward, in the order it reads them, as many
  /// as fit `allowance` bytes (-1: all). They count in `offloaded_ahead_bytes` until its first
  /// fetch. Returns the bytes.
  int64_t prefetch_ahead(int64_t allowance = -1);
  /// The data of `slot` on the device, once its copy back has landed for the current stream.
  /// Prefetches first, and the first time also looks ahead.
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
    c10::Storage device;                      // the forward's data, until let go of
    at::Tensor host;                          // bytes
    c10::Storage fetched;                     // the data back on the device
    std::shared_ptr<c10::Event> copied_back;  // its batch's copies back (fetch_in_order_locked)
    c10::Device where{c10::DeviceType::CPU};
    const c10::StorageImpl* data = nullptr;  // identity only: `device` goes at the forward's end
    int users = 0;
    bool resident = false;   // `device` stays: nothing to bring back
    bool if_let_go = false;  // copied at the forward's end, if only the group holds it then
    bool pinned = false;     // `host` is pinned memory
  };
  // The events of one device, recorded again for each use: the side stream waits for
  // `produced` before a copy; the current streams wait for `copied_out` before the device data
  // goes.
  struct DeviceEvents {
    c10::Device device;
    std::unique_ptr<c10::Event> produced, copied_out;
  };
  DeviceEvents& events_of(c10::Device device);
  void side_waits_for_current(c10::Device device);  // the device's side stream, its current one
  void start_copy(Slot& slot);
  void join_thread_chain();
  void let_go_of_device();
  void fetch_slot(Slot& slot);
  // Fetches the slots in the order the backward reads them, from where the last call stopped,
  // while their bytes fit `allowance` (-1: all); returns the bytes fetched.
  int64_t fetch_in_order_locked(int64_t allowance);
  bool all_fetched_locked() const;
  bool done_ahead();  // every slot fetched, or its backward began
  std::vector<std::shared_ptr<OffloadGroup>> groups_ahead() const;
  // Brings back as much of the groups ahead as the bytes this backward let go of allow, but for
  // its latest release (which its next temporaries may take), plus max_ahead_bytes; the next
  // group first.
  void pump_locked();
  void drop_host_locked(Slot& slot);  // gives the host copy back to the pool
  void drop_locked(Slot& slot);       // frees the slot's copies

  const OffloadSettings settings_;
  mutable std::mutex mutex_;
  std::vector<Slot> slots_;
  std::vector<DeviceEvents> events_;
  std::unordered_map<const c10::StorageImpl*, size_t> index_;  // during the forward
  std::weak_ptr<OffloadGroup> previous_;  // the group before this one in its thread's chain
  int64_t position_ = 0;                  // its number in that chain
  bool forward_done_ = false;
  bool device_kept_ = false;       // keep_last: the slots still hold their device data
  size_t next_fetch_ = 0;          // slots fetched so far, in the backward's order
  bool backward_started_ = false;  // the first fetch came
  int64_t ahead_bytes_ = 0;        // device bytes brought back ahead of this group's own backward
  // Its backward: the groups it brings back ahead, the device bytes it let go of, and the bytes
  // brought back ahead for them.
  std::vector<std::shared_ptr<OffloadGroup>> ahead_;
  int64_t released_bytes_ = 0;
  int64_t last_released_bytes_ = 0;
  int64_t pumped_bytes_ = 0;
  int64_t host_bytes_ = 0;
};

/// While it lives, the groups that finish their forward on this thread stay out of its chain:
/// no look-ahead and nothing kept on the device, for a planned schedule that brings data back
/// where its plan counted it. `take_last` gives the group that finished last in the scope, if it
/// still lives.
class ManualOffloadScope {
 public:
  ManualOffloadScope();
  ~ManualOffloadScope();
  ManualOffloadScope(const ManualOffloadScope&) = delete;
  ManualOffloadScope& operator=(const ManualOffloadScope&) = delete;
  std::shared_ptr<OffloadGroup> take_last();

 private:
  ManualOffloadScope* outer_;
  std::weak_ptr<OffloadGroup> last_;  // not held: the scope outlives groups it does not use
  friend class OffloadGroup;
};

/// Device bytes of offloaded data brought back ahead of the backward that reads it, now.
int64_t offloaded_ahead_bytes();

/// The saved-tensor hooks of offloading: a tensor on an accelerator goes to `group`; anything else
/// (host data, parameters and other leaves that require grad, which stay on the device anyway)
/// is kept as it is. A tensor that requires no grad goes only if nothing else holds it at the end
/// of the forward (a mask goes; a frozen parameter or the batch stays: issue 45, item 8).
/// Autograd checks no versions of tensors with hooks, so these hooks do.
std::unique_ptr<torch::autograd::SavedVariableHooks> offload_hooks(
    std::shared_ptr<OffloadGroup> group);

}  // namespace detail
}  // namespace ckpt
