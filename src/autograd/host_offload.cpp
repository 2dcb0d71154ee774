#include "host_offload.h"

#include "dispatch_mode.h"
#include "graph.h"
#include "saved_tensor_hooks.h"

#include <ATen/ops/empty.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <map>
#include <tuple>
#include <utility>

namespace ckpt {
namespace detail {
namespace {

std::atomic<int64_t> host_bytes_now{0};
std::atomic<int64_t> host_bytes_peak{0};

// The live HostHighWater watchers; the count lets the copies skip the lock while there are none.
std::mutex high_water_mutex;
std::vector<HostHighWater*> high_water_watchers;
std::atomic<int> high_water_count{0};

void count_host_bytes(int64_t delta) {
  const int64_t now = host_bytes_now.fetch_add(delta) + delta;
  int64_t peak = host_bytes_peak.load();
  while (now > peak && !host_bytes_peak.compare_exchange_weak(peak, now)) {
  }
  if (high_water_count.load(std::memory_order_relaxed) > 0) HostHighWater::note(now);
}

c10::Stream current_stream(c10::Device device) {
  return c10::impl::VirtualGuardImpl(device.type()).getStream(device);
}

}  // namespace

c10::Stream offload_stream(c10::Device device) {
  static std::mutex mutex;
  static std::map<std::pair<int, int>, c10::Stream> streams;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key =
      std::make_pair(static_cast<int>(device.type()), static_cast<int>(device.index()));
  auto found = streams.find(key);
  if (found == streams.end()) {
    const c10::impl::VirtualGuardImpl impl(device.type());
    found = streams.emplace(key, impl.getStreamFromGlobalPool(device)).first;
  }
  return found->second;
}

int64_t offloaded_host_bytes() {
  return host_bytes_now.load();
}
int64_t offloaded_host_peak_bytes() {
  return host_bytes_peak.load();
}
void reset_offloaded_host_peak() {
  host_bytes_peak.store(host_bytes_now.load());
}

HostHighWater::HostHighWater() {
  const std::lock_guard<std::mutex> lock(high_water_mutex);
  high_ = host_bytes_now.load();
  high_water_watchers.push_back(this);
  high_water_count.fetch_add(1);
}

HostHighWater::~HostHighWater() {
  const std::lock_guard<std::mutex> lock(high_water_mutex);
  high_water_watchers.erase(
      std::find(high_water_watchers.begin(), high_water_watchers.end(), this));
  high_water_count.fetch_sub(1);
}

int64_t HostHighWater::restart() {
  const std::lock_guard<std::mutex> lock(high_water_mutex);
  const int64_t now = host_bytes_now.load();
  const int64_t high = std::max(high_, now);
  high_ = now;
  return high;
}

void HostHighWater::note(int64_t held) {
  const std::lock_guard<std::mutex> lock(high_water_mutex);
  for (HostHighWater* watcher : high_water_watchers)
    watcher->high_ = std::max(watcher->high_, held);
}

StorageView::StorageView(const at::Tensor& tensor)
    : sizes(tensor.sizes().vec()),
      strides(tensor.strides().vec()),
      offset(tensor.storage_offset()),
      dtype(tensor.dtype()),
      conj(tensor.is_conj()),
      neg(tensor.is_neg()) {}

at::Tensor StorageView::on(const c10::Storage& storage) const {
  at::Tensor view = at::empty({0}, at::TensorOptions().dtype(dtype).device(storage.device()))
                        .set_(storage, offset, sizes, strides);
  view._set_conj(conj);
  view._set_neg(neg);
  return view;
}

namespace {

// Host buffers for offloaded data, kept for reuse: a step offloads the same sizes as the one
// before, and fresh host memory costs page faults (pinned memory: a driver call) per tensor.
// Each buffer is reused only for copies of the device it served, on that device's side stream,
// where every read and write of it is ordered: a buffer given back may still be in use there, and
// the next copy into it waits by stream order. The pool keeps at most the peak of offloaded host
// bytes.
class HostPool {
 public:
  // `pin`: asks for pinned memory; false on return when it got pageable memory.
  at::Tensor take(int64_t bytes, c10::Device device, bool& pin) {
    pin = pin && !pinning_failed_.load();
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      auto& free = free_[key(device, pin)];
      // A buffer at most an eighth larger: a few sizes repeat, and others should not pin them.
      const auto found = free.lower_bound(bytes);
      if (found != free.end() && found->first <= bytes + bytes / 8) {
        c10::Storage storage = std::move(found->second);
        free.erase(found);
        pooled_ -= static_cast<int64_t>(storage.nbytes());
        return bytes_of(storage).narrow(0, 0, bytes);
      }
    }
    return allocate(bytes, pin);
  }

  void give_back(const at::Tensor& host, c10::Device device, bool pinned) {
    const c10::Storage storage = host.storage();
    const auto bytes = static_cast<int64_t>(storage.nbytes());
    const std::lock_guard<std::mutex> lock(mutex_);
    if (pooled_ + bytes > host_bytes_peak.load()) return;  // freed with the last reference
    free_[key(device, pinned)].emplace(bytes, storage);
    pooled_ += bytes;
  }

  int64_t pooled() const {
    const std::lock_guard<std::mutex> lock(mutex_);
    return pooled_;
  }

  void allow_pinning_again() { pinning_failed_.store(false); }

  void clear() {
    const std::lock_guard<std::mutex> lock(mutex_);
    free_.clear();
    pooled_ = 0;
  }

 private:
  static std::tuple<int, int, bool> key(c10::Device device, bool pin) {
    return {static_cast<int>(device.type()), static_cast<int>(device.index()), pin};
  }

  at::Tensor allocate(int64_t bytes, bool& pin) {
    const auto options = at::TensorOptions().dtype(at::kByte);
    if (pin) {
      try {
        return at::empty({bytes}, options.pinned_memory(true));
      } catch (const c10::Error& error) {
        pin = false;
        pinning_failed_.store(true);  // for good: each try may cost a driver call
        TORCH_WARN_ONCE("ckpt: offloading could not allocate pinned host memory (",
                        error.what_without_backtrace(),
                        "); it uses pageable memory instead, whose copies don't overlap compute.");
      }
    }
    return at::empty({bytes}, options);
  }

  mutable std::mutex mutex_;
  std::map<std::tuple<int, int, bool>, std::multimap<int64_t, c10::Storage>> free_;
  int64_t pooled_ = 0;
  std::atomic<bool> pinning_failed_{false};
};

HostPool& host_pool() {
  static HostPool* pool = new HostPool();  // never destroyed: groups may outlive statics
  return *pool;
}

std::atomic<int64_t> ahead_bytes_now{0};
std::atomic<bool> pin_every_device{false};

// The chain of groups of this thread (OffloadGroup's comment), and its manual scope.
struct ThreadChain {
  std::weak_ptr<OffloadGroup> last;
  int64_t count = 0;                             // groups that joined
  std::deque<std::weak_ptr<OffloadGroup>> kept;  // groups that still hold their device data
};
thread_local ThreadChain thread_chain;
thread_local ManualOffloadScope* manual_scope = nullptr;

}  // namespace

void pin_every_device_for_testing(bool pin) {
  pin_every_device.store(pin);
  host_pool().allow_pinning_again();
}

int64_t pooled_host_bytes() {
  return host_pool().pooled();
}

void empty_host_pool() {
  host_pool().clear();
}

int64_t offloaded_ahead_bytes() {
  return ahead_bytes_now.load();
}

ManualOffloadScope::ManualOffloadScope() : outer_(manual_scope) {
  manual_scope = this;
}

ManualOffloadScope::~ManualOffloadScope() {
  manual_scope = outer_;
}

std::shared_ptr<OffloadGroup> ManualOffloadScope::take_last() {
  std::shared_ptr<OffloadGroup> last = last_.lock();
  last_.reset();
  return last;
}

OffloadGroup::~OffloadGroup() {
  count_host_bytes(-host_bytes_);
  ahead_bytes_now.fetch_sub(ahead_bytes_);
}

OffloadGroup::DeviceEvents& OffloadGroup::events_of(c10::Device device) {
  for (DeviceEvents& events : events_) {
    if (events.device == device) return events;
  }
  const auto type = device.type();
  events_.push_back(
      {device, std::make_unique<c10::Event>(type), std::make_unique<c10::Event>(type)});
  return events_.back();
}

void OffloadGroup::side_waits_for_current(c10::Device device) {
  const c10::Stream current = current_stream(device);
  const c10::Stream side = offload_stream(device);
  if (current == side) return;
  c10::Event& produced = *events_of(device).produced;  // one event, recorded again for each wait
  produced.record(current);
  produced.block(side);
}

void OffloadGroup::keep_on_device(const std::vector<at::Tensor>& tensors) {
  const std::lock_guard<std::mutex> lock(mutex_);
  for (const at::Tensor& tensor : tensors) {
    if (!tensor.defined() || !tensor.has_storage() || tensor.device().is_cpu()) continue;
    const c10::StorageImpl* key = tensor.storage().unsafeGetStorageImpl();
    if (index_.count(key) != 0) continue;
    Slot slot;
    slot.device = tensor.storage();
    slot.where = tensor.device();
    slot.data = key;
    slot.resident = true;
    index_.emplace(key, slots_.size());
    slots_.push_back(std::move(slot));
  }
}

bool OffloadGroup::takes(const at::Tensor& tensor) const {
  return tensor.device().type() != c10::DeviceType::CPU && tensor.has_storage() &&
         tensor.layout() == c10::kStrided &&
         static_cast<int64_t>(tensor.storage().nbytes()) >= settings_.min_bytes;
}

size_t OffloadGroup::add(const at::Tensor& tensor, bool if_let_go) {
  const std::lock_guard<std::mutex> lock(mutex_);
  TORCH_INTERNAL_ASSERT(!forward_done_, "ckpt: offloading after the forward's end");
  const c10::StorageImpl* key = tensor.storage().unsafeGetStorageImpl();
  auto found = index_.find(key);
  if (found != index_.end()) {
    Slot& slot = slots_[found->second];
    ++slot.users;
    // Saved once as data to copy now: that decides.
    if (slot.if_let_go && !if_let_go && !slot.resident) start_copy(slot);
    return found->second;
  }
  Slot slot;
  slot.device = tensor.storage();
  slot.where = tensor.device();
  slot.data = key;
  slot.users = 1;
  slot.if_let_go = if_let_go;
  if (!if_let_go) start_copy(slot);
  index_.emplace(key, slots_.size());
  slots_.push_back(std::move(slot));
  return slots_.size() - 1;
}

void OffloadGroup::start_copy(Slot& slot) {
  const DispatchModesOff modes_off;  // the copy is no operator of the forward's
  slot.if_let_go = false;
  side_waits_for_current(slot.where);  // for the work that made this data
  slot.pinned = settings_.pin_memory && (slot.where.is_cuda() || pin_every_device.load());
  slot.host = host_pool().take(static_cast<int64_t>(slot.device.nbytes()), slot.where, slot.pinned);
  {
    const c10::StreamGuard on_side(offload_stream(slot.where));
    slot.host.copy_(bytes_of(slot.device), /*non_blocking=*/true);
  }
  host_bytes_ += slot.host.nbytes();
  count_host_bytes(slot.host.nbytes());
}

void OffloadGroup::finish_forward(const std::vector<at::Tensor>& resident) {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    for (const at::Tensor& tensor : resident) {
      if (!tensor.defined() || !tensor.has_storage()) continue;
      const auto found = index_.find(tensor.storage().unsafeGetStorageImpl());
      if (found == index_.end()) continue;
      Slot& slot = slots_[found->second];
      // Dropped below; or met already (one storage twice among arguments and results: issue 45,
      // item 7, where the second met a slot without host memory).
      if (slot.users == 0 || slot.resident) continue;
      slot.resident = true;
      if (slot.if_let_go) continue;  // never copied
      // The copy writes into host memory that goes back to the pool now.
      c10::impl::VirtualGuardImpl(slot.where.type()).synchronizeStream(offload_stream(slot.where));
      drop_host_locked(slot);
    }
    for (Slot& slot : slots_) {
      if (slot.resident) {
        if (slot.users == 0) drop_locked(slot);  // kept, and never saved
        continue;
      }
      if (slot.if_let_go) {
        if (slot.users == 0) {
          drop_locked(slot);
          continue;
        }
        // Copied only if the group's own reference is the last: else the data stays anyway.
        if (slot.device.use_count() > 1) {
          slot.resident = true;
          continue;
        }
        start_copy(slot);
      }
      if (slot.users == 0) drop_locked(slot);  // saved, then let go of, inside the forward
    }
    for (DeviceEvents& events : events_) events.copied_out->record(offload_stream(events.device));
    index_.clear();
    forward_done_ = true;
    device_kept_ = true;
  }
  join_thread_chain();
}

void OffloadGroup::join_thread_chain() {
  if (manual_scope != nullptr) {
    manual_scope->last_ = weak_from_this();
    let_go_of_device();
    return;
  }
  if (!settings_.in_chain) {
    let_go_of_device();
    return;
  }
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    previous_ = thread_chain.last;
  }
  thread_chain.last = weak_from_this();
  position_ = ++thread_chain.count;
  // The newest groups keep their device data, each while it is among its own keep_last newest.
  auto& kept = thread_chain.kept;
  kept.push_back(weak_from_this());
  for (auto it = kept.begin(); it != kept.end();) {
    const std::shared_ptr<OffloadGroup> group = it->lock();
    if (group && thread_chain.count - group->position_ < group->settings_.keep_last) {
      ++it;
      continue;
    }
    if (group) group->let_go_of_device();
    it = kept.erase(it);
  }
}

void OffloadGroup::let_go_of_device() {
  const std::lock_guard<std::mutex> lock(mutex_);
  // Once its backward has begun (or data came back ahead), the data is in use where it is.
  if (!device_kept_ || backward_started_ || next_fetch_ > 0) return;
  device_kept_ = false;
  // The current streams wait for the copies out before the memory they read can be reused.
  for (DeviceEvents& events : events_) events.copied_out->block(current_stream(events.device));
  for (Slot& slot : slots_) {
    if (!slot.resident) slot.device = c10::Storage();
  }
}

void OffloadGroup::drop_host_locked(Slot& slot) {
  if (!slot.host.defined()) return;
  const int64_t bytes = slot.host.nbytes();
  host_pool().give_back(slot.host, slot.where, slot.pinned);
  slot.host = at::Tensor();
  host_bytes_ -= bytes;
  count_host_bytes(-bytes);
}

void OffloadGroup::drop_locked(Slot& slot) {
  // The copies read and write on the side stream, in order: a later copy into this memory waits.
  drop_host_locked(slot);
  // Device memory this group's backward lets go of: room for the groups ahead (pump_locked).
  if (backward_started_ && (slot.fetched || (slot.device && !slot.resident))) {
    last_released_bytes_ =
        static_cast<int64_t>(slot.fetched ? slot.fetched.nbytes() : slot.device.nbytes());
    released_bytes_ += last_released_bytes_;
  }
  slot = Slot();
}

void OffloadGroup::fetch_slot(Slot& slot) {
  const DispatchModesOff modes_off;
  const c10::Stream side = offload_stream(slot.where);
  const c10::DeviceGuard on_device(slot.where);
  at::Tensor target =
      at::empty({slot.host.numel()}, at::TensorOptions().dtype(at::kByte).device(slot.where));
  {
    const c10::StreamGuard on_side(side);
    target.copy_(slot.host, /*non_blocking=*/true);
  }
  slot.fetched = target.storage();
}

int64_t OffloadGroup::fetch_in_order_locked(int64_t allowance) {
  TORCH_INTERNAL_ASSERT(forward_done_, "ckpt: offloaded data fetched before its forward ended");
  int64_t fetched = 0;
  // One event per device for the copies of this call: a use waits for its own batch, not for
  // copies queued after it (a look-ahead fetches a group in many batches).
  std::vector<std::pair<c10::Device, std::shared_ptr<c10::Event>>> batch;
  for (; next_fetch_ < slots_.size(); ++next_fetch_) {
    Slot& slot = slots_[settings_.last_first ? slots_.size() - 1 - next_fetch_ : next_fetch_];
    // Resident data stays; kept data (keep_last) is still there.
    if (slot.users == 0 || slot.resident || slot.device) continue;
    const int64_t bytes = slot.host.nbytes();
    if (allowance >= 0 && fetched + bytes > allowance) break;
    auto found = std::find_if(batch.begin(), batch.end(),
                              [&](const auto& entry) { return entry.first == slot.where; });
    if (found == batch.end()) {
      // The new device memory is allocated on the current stream, and may have been in use there
      // until now.
      side_waits_for_current(slot.where);
      batch.emplace_back(slot.where, std::make_shared<c10::Event>(slot.where.type()));
      found = std::prev(batch.end());
    }
    fetch_slot(slot);
    slot.copied_back = found->second;
    fetched += bytes;
  }
  for (const auto& [device, event] : batch) event->record(offload_stream(device));
  return fetched;
}

bool OffloadGroup::all_fetched_locked() const {
  return next_fetch_ == slots_.size() || backward_started_;
}

int64_t OffloadGroup::prefetch() {
  const std::lock_guard<std::mutex> lock(mutex_);
  return fetch_in_order_locked(-1);
}

int64_t OffloadGroup::prefetch_ahead(int64_t allowance) {
  const std::lock_guard<std::mutex> lock(mutex_);
  if (backward_started_) return 0;  // its own backward brings the rest
  const int64_t bytes = fetch_in_order_locked(allowance);
  ahead_bytes_ += bytes;
  ahead_bytes_now.fetch_add(bytes);
  return bytes;
}

bool OffloadGroup::done_ahead() {
  const std::lock_guard<std::mutex> lock(mutex_);
  return all_fetched_locked();
}

std::vector<std::shared_ptr<OffloadGroup>> OffloadGroup::groups_ahead() const {
  std::vector<std::shared_ptr<OffloadGroup>> ahead;
  std::shared_ptr<OffloadGroup> group = previous_.lock();
  while (group && static_cast<int>(ahead.size()) < settings_.look_ahead) {
    ahead.push_back(group);
    const std::lock_guard<std::mutex> lock(group->mutex_);
    group = group->previous_.lock();
  }
  return ahead;
}

void OffloadGroup::pump_locked() {
  for (const std::shared_ptr<OffloadGroup>& group : ahead_) {
    int64_t allowance = -1;
    if (settings_.max_ahead_bytes >= 0) {
      allowance =
          released_bytes_ - last_released_bytes_ + settings_.max_ahead_bytes - pumped_bytes_;
      if (allowance <= 0) return;
    }
    pumped_bytes_ += group->prefetch_ahead(allowance);
    // In the order the backward reaches them: the next group waits for this one's last slot.
    if (!group->done_ahead()) return;
  }
}

c10::Storage OffloadGroup::fetch(size_t slot_index) {
  const std::lock_guard<std::mutex> lock(mutex_);
  // A backward inside the scope that saved it (as Python's save_on_cpu allows): the slot still
  // holds the device data, which the forward's writes can't have touched (the unpack hook checked
  // the version).
  if (!forward_done_) return slots_.at(slot_index).device;
  if (!backward_started_) {
    // What came back ahead is in use now; the rest comes now, and behind it the groups ahead, as
    // this backward lets go of device memory (pump_locked).
    fetch_in_order_locked(-1);
    backward_started_ = true;
    ahead_bytes_now.fetch_sub(ahead_bytes_);
    ahead_bytes_ = 0;
    ahead_ = groups_ahead();
    pump_locked();
  }
  Slot& slot = slots_.at(slot_index);
  if (slot.resident || slot.device) return slot.device;
  TORCH_INTERNAL_ASSERT(slot.users > 0 && slot.fetched, "ckpt: offloaded data used up");
  slot.copied_back->block(current_stream(slot.where));
  return slot.fetched;
}

void OffloadGroup::release(size_t slot_index) {
  const std::lock_guard<std::mutex> lock(mutex_);
  Slot& slot = slots_.at(slot_index);
  // During the forward the slot stays: its copy is in flight, and the forward may save the same
  // data again (the slot holds it, so no other data takes its address). finish_forward drops it.
  if (--slot.users > 0 || !forward_done_) return;
  drop_locked(slot);
  if (backward_started_) pump_locked();
}

int64_t OffloadGroup::host_bytes() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return host_bytes_;
}

std::vector<OffloadGroup::SlotState> OffloadGroup::slot_states() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  std::vector<SlotState> states;
  for (const Slot& slot : slots_) {
    states.push_back({slot.data, slot.where,
                      slot.host.defined() ? static_cast<int64_t>(slot.host.nbytes()) : 0});
  }
  return states;
}

namespace {

class OffloadHooks final : public torch::autograd::SavedVariableHooks {
 public:
  explicit OffloadHooks(std::shared_ptr<OffloadGroup> group) : group_(std::move(group)) {}
  ~OffloadHooks() override {
    if (slot_) group_->release(*slot_);
  }

  void call_pack_hook(const at::Tensor& tensor) override {
    version_.note(tensor);
    if (!group_->takes(tensor) || of_parameter(tensor)) {
      kept_ = tensor.detach();  // no reference cycle through an output's own node
      return;
    }
    view_.emplace(tensor);
    // What requires no grad may be data that lives on (a frozen parameter, the batch).
    slot_ = group_->add(tensor, /*if_let_go=*/!tensor.requires_grad());
  }

  at::Tensor call_unpack_hook() override {
    version_.check(" after ckpt offloaded it");
    if (!slot_) return kept_;
    return view_->on(group_->fetch(*slot_));
  }

 private:
  std::shared_ptr<OffloadGroup> group_;
  SavedVersion version_;
  at::Tensor kept_;
  c10::optional<StorageView> view_;
  c10::optional<size_t> slot_;
};

}  // namespace

std::unique_ptr<torch::autograd::SavedVariableHooks> offload_hooks(
    std::shared_ptr<OffloadGroup> group) {
  return std::make_unique<OffloadHooks>(std::move(group));
}

}  // namespace detail
}  // namespace ckpt
