// OffloadGuard and offloaded regions: saved-tensor hooks (autograd/saved_tensor_hooks.h) that send
// what autograd saves to an OffloadGroup (autograd/host_offload.h).

#include <ckpt/offload.h>

#include "autograd/host_offload.h"
#include "autograd/saved_tensor_hooks.h"

#include <c10/util/Exception.h>

#include <utility>

namespace ckpt {

OffloadGuard::OffloadGuard(const OffloadOptions& options)
    : group_(std::make_shared<detail::OffloadGroup>(options.pin_memory())) {
  scope_ = std::make_unique<detail::SavedTensorHooksScope>(
      [group = group_] { return detail::offload_hooks(group); });
}

OffloadGuard::~OffloadGuard() {
  scope_.reset();
  group_->finish_forward();
}

int64_t OffloadGuard::host_bytes() const {
  return group_->host_bytes();
}

OffloadStats offload_stats() {
  return {detail::offloaded_host_bytes(), detail::offloaded_host_peak_bytes()};
}

void reset_offload_peak() {
  detail::reset_offloaded_host_peak();
}

namespace detail {

OffloadedRegion::OffloadedRegion(const CheckpointOptions& options,
                                 const std::vector<at::Tensor>& inputs) {
  TORCH_CHECK(!options.use_reentrant(),
              "ckpt::checkpoint: offload(true) runs the region once and sends what autograd saves "
              "to host memory; the reentrant variant saves nothing to send. Drop "
              "use_reentrant(true), or offload(true).");
  TORCH_CHECK(!options.policy(),
              "ckpt::checkpoint: offload(true) offloads everything the region saves, and a "
              "selective policy decides operator by operator. Drop one: to offload some operators "
              "and recompute the rest, return MustOffload for them from the policy.");
  bool on_accelerator = false;
  for (const at::Tensor& input : inputs) {
    on_accelerator = on_accelerator || (input.defined() && !input.device().is_cpu());
  }
  TORCH_CHECK(on_accelerator,
              "ckpt::checkpoint: offload(true) moves what the region saves from an accelerator to "
              "host memory, but the region's tensor arguments are all in host memory already. Run "
              "the region on the device, or drop offload(true) (checkpointing saves host memory "
              "here).");
  if (options.context_fn()) {
    RegionContexts contexts = options.context_fn()();
    if (contexts.forward) context_ = contexts.forward();
  }
  guard_ = std::make_unique<OffloadGuard>();
}

OffloadedRegion::~OffloadedRegion() = default;

}  // namespace detail
}  // namespace ckpt
