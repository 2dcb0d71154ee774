#pragma once

// State a region's function changes that ckpt was not told about: the running statistics of a
// TorchScript module, or of a C++ module a lambda captures. Every recompute puts it back
// afterwards, so it changes once per step, as without checkpointing.

#include <ckpt/detail/region.h>

#include "autograd/dispatch_mode.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Storage.h>

#include <unordered_set>
#include <vector>

namespace ckpt {
namespace detail {

/// A dispatch mode that copies, before an operator first writes into it, the data of every tensor
/// that doesn't require grad and that neither an operator under the mode created nor `known`
/// holds (the region's arguments, the parameters and buffers of its modules, which `BufferGuard`
/// restores already), and writes it all back when destroyed (also when an exception leaves the
/// scope), through aliases of its own, so that no tensor's version counter moves (the recompute's
/// graph may have saved one). Written: marked so in the operator's schema, or any tensor argument
/// of a batch or instance normalization (native_batch_norm writes its running statistics without
/// the mark). What a recompute watched this way changes outside the region so stays as the
/// forward left it, whichever module, captured by whichever lambda, the call site ran this time.
class OutsideStateWatch : public DispatchMode {
 public:
  OutsideStateWatch(const std::vector<at::Tensor>& known, const ModuleList& modules);
  ~OutsideStateWatch() override;
  OutsideStateWatch(const OutsideStateWatch&) = delete;
  OutsideStateWatch& operator=(const OutsideStateWatch&) = delete;

  void dispatch(const c10::OperatorHandle& op, torch::jit::Stack* stack) override;

 private:
  void see(const at::Tensor& tensor);

  std::unordered_set<const c10::StorageImpl*> inside_;
  struct Seen {
    at::Tensor alias;   // all the storage's bytes, through a tensor of its own
    at::Tensor before;  // their copy, taken before the first write
  };
  std::vector<Seen> seen_;
};

/// Whether `op` is a normalization that updates running statistics in place, which some of their
/// schemas do not mark as written (native_batch_norm's running_mean and running_var in 1.13).
bool updates_running_statistics(const c10::OperatorHandle& op);

}  // namespace detail
}  // namespace ckpt
