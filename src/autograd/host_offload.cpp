#include "host_offload.h"

#include "dispatch_mode.h"

#include <ATen/ops/empty.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <utility>

namespace ckpt {
namespace detail {
namespace {

std::atomic<int64_t> host_bytes_now{0};
std::atomic<int64_t> host_bytes_peak{0};

void count_host_bytes(int64_t delta) {
  const int64_t now = host_bytes_now.fetch_add(delta) + delta;
  int64_t peak = host_bytes_peak.load();
  while (now > peak && !host_bytes_peak.compare_exchange_weak(peak, now)) {
  }
}

c10::Stream current_stream(c10::Device device) {
  return c10::impl::VirtualGuardImpl(device.type()).getStream(device);
}

// `waiter` waits for the work enqueued on `stream` so far.
void wait_for(const c10::Stream& stream, const c10::Stream& waiter) {
  if (stream == waiter) return;
  c10::Event event(stream.device_type());
  event.record(stream);
  event.block(waiter);
}

// The storage's bytes as a 1-d byte tensor on its device.
at::Tensor bytes_of(const c10::Storage& storage) {
  return at::empty({0}, at::TensorOptions().dtype(at::kByte).device(storage.device()))
      .set_(storage, 0, {static_cast<int64_t>(storage.nbytes())}, {1});
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

OffloadGroup::~OffloadGroup() {
  count_host_bytes(-host_bytes_);
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
  const c10::Stream side = offload_stream(slot.where);
  wait_for(current_stream(slot.where), side);
  const bool pin = pin_memory_ && slot.where.is_cuda();
  slot.host = at::empty({static_cast<int64_t>(slot.device.nbytes())},
                        at::TensorOptions().dtype(at::kByte).pinned_memory(pin));
  {
    const c10::StreamGuard on_side(side);
    slot.host.copy_(bytes_of(slot.device), /*non_blocking=*/true);
    slot.copied = std::make_unique<c10::Event>(slot.where.type());
    slot.copied->record(side);
  }
  host_bytes_ += slot.host.nbytes();
  count_host_bytes(slot.host.nbytes());
}

void OffloadGroup::finish_forward(const std::vector<at::Tensor>& resident) {
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
    // The copy writes into the host memory that goes now.
    c10::impl::VirtualGuardImpl(slot.where.type()).synchronizeStream(offload_stream(slot.where));
    host_bytes_ -= slot.host.nbytes();
    count_host_bytes(-slot.host.nbytes());
    slot.host = at::Tensor();
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
    slot.copied->block(current_stream(slot.where));
    slot.device = c10::Storage();
    if (slot.users == 0) drop_locked(slot);  // saved, then let go of, inside the forward
  }
  index_.clear();
  forward_done_ = true;
}

void OffloadGroup::drop_locked(Slot& slot) {
  const int64_t bytes = slot.host.defined() ? slot.host.nbytes() : 0;
  // The copies read and write on the side stream, in order: a later copy into this memory waits.
  slot = Slot();
  host_bytes_ -= bytes;
  count_host_bytes(-bytes);
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
    slot.fetched_event = std::make_unique<c10::Event>(slot.where.type());
    slot.fetched_event->record(side);
  }
  slot.fetched = target.storage();
}

void OffloadGroup::prefetch_locked() {
  if (prefetched_) return;
  prefetched_ = true;
  TORCH_INTERNAL_ASSERT(forward_done_, "ckpt: offloaded data fetched before its forward ended");
  // The side streams wait for the current streams once: the new device memory was allocated on
  // them, and may have been in use there until now.
  std::vector<c10::Device> waited;
  for (size_t k = 0; k < slots_.size(); ++k) {
    Slot& slot = slots_[last_first_ ? slots_.size() - 1 - k : k];
    if (slot.users == 0 || slot.resident) continue;
    if (std::find(waited.begin(), waited.end(), slot.where) == waited.end()) {
      wait_for(current_stream(slot.where), offload_stream(slot.where));
      waited.push_back(slot.where);
    }
    fetch_slot(slot);
  }
}

void OffloadGroup::prefetch() {
  const std::lock_guard<std::mutex> lock(mutex_);
  prefetch_locked();
}

c10::Storage OffloadGroup::fetch(size_t slot_index) {
  const std::lock_guard<std::mutex> lock(mutex_);
  // A backward inside the scope that saved it (as Python's save_on_cpu allows): the slot still
  // holds the device data, which the forward's writes can't have touched (the unpack hook checked
  // the version).
  if (!forward_done_) return slots_.at(slot_index).device;
  prefetch_locked();
  Slot& slot = slots_.at(slot_index);
  if (slot.resident) return slot.device;
  TORCH_INTERNAL_ASSERT(slot.users > 0 && slot.fetched_event, "ckpt: offloaded data used up");
  slot.fetched_event->block(current_stream(slot.where));
  return slot.fetched;
}

void OffloadGroup::release(size_t slot_index) {
  const std::lock_guard<std::mutex> lock(mutex_);
  Slot& slot = slots_.at(slot_index);
  // During the forward the slot stays: its copy is in flight, and the forward may save the same
  // data again (the slot holds it, so no other data takes its address). finish_forward drops it.
  if (--slot.users > 0 || !forward_done_) return;
  drop_locked(slot);
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

// A leaf that requires grad (a parameter), or a view of one (Linear saves its weight
// transposed): it stays on the device anyway.
bool of_parameter(const at::Tensor& tensor) {
  const at::Tensor base = tensor.is_view() ? at::Tensor(tensor._base()) : tensor;
  return base.is_leaf() && base.requires_grad();
}

class OffloadHooks final : public torch::autograd::SavedVariableHooks {
 public:
  explicit OffloadHooks(std::shared_ptr<OffloadGroup> group) : group_(std::move(group)) {}
  ~OffloadHooks() override {
    if (slot_) group_->release(*slot_);
  }

  void call_pack_hook(const at::Tensor& tensor) override {
    counter_ = tensor.unsafeGetTensorImpl()->version_counter();
    if (counter_.enabled()) version_ = counter_.current_version();
    const bool offload = tensor.device().type() != c10::DeviceType::CPU && tensor.has_storage() &&
                         tensor.layout() == c10::kStrided && !of_parameter(tensor);
    if (!offload) {
      kept_ = tensor.detach();  // no reference cycle through an output's own node
      return;
    }
    view_.emplace(tensor);
    // What requires no grad may be data that lives on (a frozen parameter, the batch).
    slot_ = group_->add(tensor, /*if_let_go=*/!tensor.requires_grad());
  }

  at::Tensor call_unpack_hook() override {
    TORCH_CHECK(!counter_.enabled() || counter_.current_version() == version_,
                "one of the variables needed for gradient computation has been modified by an "
                "inplace operation after ckpt offloaded it: it is at version ",
                counter_.current_version(), "; expected version ", version_,
                " instead. Don't modify a tensor in place after the forward saved it.");
    if (!slot_) return kept_;
    return view_->on(group_->fetch(*slot_));
  }

 private:
  std::shared_ptr<OffloadGroup> group_;
  c10::VariableVersion counter_{c10::VariableVersion::DISABLED};
  uint32_t version_ = 0;
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
