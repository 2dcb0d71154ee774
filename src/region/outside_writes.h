#pragma once

// State a region's function changes that ckpt was not told about: the running statistics of a
// TorchScript module, or of a C++ module a lambda captures. The first forward at a call site finds
// such state; recomputes there put it back afterwards, so it changes once per step, as without
// checkpointing.

#include <ckpt/detail/region.h>

#include "autograd/dispatch_mode.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Storage.h>

#include <string>
#include <unordered_set>
#include <vector>

namespace ckpt {
namespace detail {

/// A dispatch mode that copies, before an operator first writes into it, the data of every tensor
/// that doesn't require grad and that neither an operator under the mode created nor `known`
/// holds (the region's arguments, the parameters and buffers of its modules, which `BufferGuard`
/// restores already). Written: marked so in the operator's schema, or any tensor argument of a
/// batch or instance normalization (native_batch_norm writes its running statistics without the
/// mark). Comparing afterwards tells which the function changed.
/// Destroyed before `changed()` was asked (the function threw), it puts them all back.
class OutsideStateWatch : public DispatchMode {
 public:
  OutsideStateWatch(const std::vector<at::Tensor>& known, const ModuleList& modules);
  ~OutsideStateWatch() override;
  OutsideStateWatch(const OutsideStateWatch&) = delete;
  OutsideStateWatch& operator=(const OutsideStateWatch&) = delete;

  void dispatch(const c10::OperatorHandle& op, torch::jit::Stack* stack) override;

  /// The storages whose data differs from before the function; `first` describes one of them
  /// ("a tensor of shape [8] (Float) that aten::native_batch_norm wrote into").
  std::vector<c10::Storage> changed(std::string& first);

 private:
  void see(const c10::OperatorHandle& op, const at::Tensor& tensor);

  std::unordered_set<const c10::StorageImpl*> inside_;
  struct Seen {
    c10::Storage storage;
    at::Tensor before;
    std::string what;
  };
  std::vector<Seen> seen_;
};

/// Copies the data of `storages` when constructed and writes it back when destroyed (also when
/// an exception leaves the scope), through aliases of their own, so that no tensor's version
/// counter moves (a recompute's graph may have saved one).
class StorageSnapshot {
 public:
  explicit StorageSnapshot(const std::vector<c10::Storage>& storages);
  ~StorageSnapshot();
  StorageSnapshot(const StorageSnapshot&) = delete;
  StorageSnapshot& operator=(const StorageSnapshot&) = delete;

 private:
  std::vector<at::Tensor> aliases_, saved_;
};

/// Whether `op` is a normalization that updates running statistics in place, which some of their
/// schemas do not mark as written (native_batch_norm's running_mean and running_var in 1.13).
bool updates_running_statistics(const c10::OperatorHandle& op);

}  // namespace detail
}  // namespace ckpt
