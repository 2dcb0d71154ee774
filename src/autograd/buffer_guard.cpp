#include "buffer_guard.h"

#include "dispatch_mode.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/equal.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>

#include <exception>
#include <unordered_map>
#include <unordered_set>

namespace ckpt {
namespace detail {
namespace {

// Whether `buffer` holds `copy`'s shape, dtype and values. Where that can't be told, no: the copy
// is kept (a NaN; a meta tensor, planned without the device, whose kernels may write without
// moving the version, as a device's may). ckpt's own comparison: no dispatch mode sees it.
bool same_values(const at::Tensor& buffer, const at::Tensor& copy) {
  if (buffer.sizes() != copy.sizes() || buffer.scalar_type() != copy.scalar_type()) return false;
  if (buffer.is_meta()) return false;
  const c10::impl::ExcludeDispatchKeyGuard no_modes(c10::DispatchKey::Fake);
  return at::equal(buffer, copy);
}

// Writes `value`, a copy of `buffer` taken earlier, back into it. Through an alias with its own
// version counter where the shape is the same: a recompute's graph may have saved the buffer (as
// BatchNorm saves its running statistics), and a version bump would make its backward refuse it.
// A buffer the function gave another shape or dtype (`set_`, `resize_`) takes the copy's data
// itself.
void write_back(const at::Tensor& buffer, const at::Tensor& value) {
  if (buffer.sizes() == value.sizes() && buffer.scalar_type() == value.scalar_type()) {
    buffer.variable_data().copy_(value);
  } else {
    at::Tensor(buffer).set_(value.clone());
  }
}

}  // namespace

BufferGuard::BufferGuard(const std::vector<std::shared_ptr<torch::nn::Module>>& modules,
                         Copy copy) {
  for (const auto& module : modules) {
    for (const auto& buffer : module->buffers(/*recurse=*/true)) {
      if (!buffer.defined()) continue;
      buffers_.push_back(buffer);
      saved_.push_back(copy == Copy::Now ? buffer.clone() : at::Tensor());
    }
  }
}

void BufferGuard::copy_before_write(const c10::StorageImpl* storage) {
  for (size_t i = 0; i < buffers_.size(); ++i) {
    if (saved_[i].defined() || storage_of(buffers_[i]) != storage) continue;
    const DispatchModesOff modes_off;  // ckpt's own copy: no dispatch mode sees it
    const at::NoGradGuard no_grad;
    saved_[i] = buffers_[i].clone();
  }
}

BufferGuard::~BufferGuard() {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < buffers_.size(); ++i) {
    if (!saved_[i].defined()) continue;  // never written
    try {
      write_back(buffers_[i], saved_[i]);
    } catch (const std::exception& e) {  // a destructor must not throw: say so and go on
      TORCH_WARN("ckpt: could not put back a module buffer of shape ", saved_[i].sizes(), ": ",
                 e.what());
    }
  }
}

BuffersAtForward::BuffersAtForward(const std::vector<std::shared_ptr<torch::nn::Module>>& modules,
                                   uint64_t copy, uint64_t keep)
    : keep_(keep) {
  for (const auto& module : modules) {
    for (const auto& buffer : module->buffers(/*recurse=*/true)) {
      if (!buffer.defined()) continue;
      const bool copied = (copy & site_bit(buffers_.size())) != 0;
      buffers_.push_back(buffer);
      versions_.push_back(buffer._version());
      copies_.push_back(copied ? buffer.clone() : at::Tensor());
    }
  }
  seen_written_.assign(buffers_.size(), false);
}

void BuffersAtForward::note_write(const c10::StorageImpl* storage) {
  for (size_t i = 0; i < buffers_.size(); ++i) {
    if (storage_of(buffers_[i]) == storage) seen_written_[i] = true;
  }
}

uint64_t BuffersAtForward::finish() {
  uint64_t written = 0;
  for (size_t i = 0; i < buffers_.size(); ++i) {
    // Written: its version moved, an operator was seen writing it, or (a write through `.data()`
    // or `variable_data()`, which have counters of their own) its values or shape changed.
    const bool same = buffers_[i]._version() == versions_[i] && !seen_written_[i] &&
                      (!copies_[i].defined() || same_values(buffers_[i], copies_[i]));
    if (same) {
      if ((keep_ & site_bit(i)) == 0) copies_[i] = at::Tensor();
      continue;
    }
    written |= site_bit(i);
    lost_ = lost_ || !copies_[i].defined();
  }
  return written;
}

bool BuffersAtForward::lost_so_far() const {
  for (size_t i = 0; i < buffers_.size(); ++i) {
    if (!copies_[i].defined() && (seen_written_[i] || buffers_[i]._version() != versions_[i])) {
      return true;
    }
  }
  return false;
}

void BuffersAtForward::restore() const {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < buffers_.size(); ++i) {
    if (copies_[i].defined()) write_back(buffers_[i], copies_[i]);
  }
}

std::vector<uint64_t> buffers_shared_between(
    const std::vector<std::shared_ptr<torch::nn::Module>>& stages) {
  std::unordered_map<const c10::StorageImpl*, int> stages_of;  // how many stages hold the data
  std::vector<std::vector<const c10::StorageImpl*>> storages(stages.size());
  for (size_t s = 0; s < stages.size(); ++s) {
    std::unordered_set<const c10::StorageImpl*> own;
    for (const auto& buffer : stages[s]->buffers(/*recurse=*/true)) {
      if (!buffer.defined()) continue;
      storages[s].push_back(storage_of(buffer));
      if (own.insert(storage_of(buffer)).second) ++stages_of[storage_of(buffer)];
    }
  }
  std::vector<uint64_t> shared(stages.size(), 0);
  for (size_t s = 0; s < stages.size(); ++s) {
    for (size_t i = 0; i < storages[s].size(); ++i) {
      if (storages[s][i] != nullptr && stages_of[storages[s][i]] > 1) shared[s] |= site_bit(i);
    }
  }
  return shared;
}

}  // namespace detail
}  // namespace ckpt
