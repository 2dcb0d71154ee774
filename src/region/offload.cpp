// OffloadGuard and offloaded regions: saved-tensor hooks (autograd/saved_tensor_hooks.h) that send
// what autograd saves to an OffloadGroup (autograd/host_offload.h).

#include <ckpt/offload.h>

#include "autograd/host_offload.h"
#include "autograd/saved_tensor_hooks.h"
#include "report_record.h"

#include <ckpt/memory_label.h>
#include <ckpt/report.h>

#include <ATen/ops/empty.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include <utility>

namespace ckpt {

namespace detail {
namespace {

OffloadSettings offload_settings(const OffloadOptions& options, const char* function) {
  TORCH_CHECK(options.look_ahead() >= 0 && options.keep_last() >= 0 && options.min_bytes() >= 0,
              function,
              ": OffloadOptions' look_ahead, keep_last and min_bytes must be >= 0, but "
              "got ",
              options.look_ahead(), ", ", options.keep_last(), " and ", options.min_bytes(), ".");
  TORCH_CHECK(options.max_ahead_bytes() >= -1, function,
              ": OffloadOptions().max_ahead_bytes must be >= 0 bytes, or -1 for whole scopes at "
              "once, but got ",
              options.max_ahead_bytes(), ".");
  OffloadSettings settings;
  settings.pin_memory = options.pin_memory();
  settings.look_ahead = options.look_ahead();
  settings.max_ahead_bytes = options.max_ahead_bytes();
  settings.keep_last = options.keep_last();
  settings.min_bytes = options.min_bytes();
  return settings;
}

}  // namespace
}  // namespace detail

OffloadGuard::OffloadGuard(const OffloadOptions& options)
    : group_(std::make_shared<detail::OffloadGroup>(
          detail::offload_settings(options, "ckpt::OffloadGuard"))) {
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
  return {detail::offloaded_host_bytes(), detail::offloaded_host_peak_bytes(),
          detail::pooled_host_bytes(), detail::offloaded_ahead_bytes()};
}

void empty_offload_pool() {
  detail::empty_host_pool();
}

void reset_offload_peak() {
  detail::reset_offloaded_host_peak();
}

double measure_host_bandwidth(c10::Device device, int64_t bytes, int repeats) {
  TORCH_CHECK(!device.is_cpu(), "ckpt::measure_host_bandwidth: ", device,
              " is the host; give an accelerator.");
  TORCH_CHECK(bytes > 0 && repeats > 0,
              "ckpt::measure_host_bandwidth: bytes and repeats must be positive, but got ", bytes,
              " and ", repeats, ".");
  const c10::DeviceGuard device_guard(device);
  const c10::Stream side = detail::offload_stream(device);
  const c10::impl::VirtualGuardImpl impl(device.type());
  const auto bytes_on = [&](c10::Device where, bool pin) {
    return at::empty({bytes},
                     at::TensorOptions().dtype(at::kByte).device(where).pinned_memory(pin));
  };
  at::Tensor on_device = bytes_on(device, false).fill_(1);
  at::Tensor on_host = bytes_on(c10::Device(c10::DeviceType::CPU), device.is_cuda());
  std::vector<double> rates;
  for (int r = 0; r < repeats; ++r) {
    impl.synchronizeStream(impl.getStream(device));
    const auto start = std::chrono::steady_clock::now();
    {
      const c10::StreamGuard on_side(side);
      on_host.copy_(on_device, /*non_blocking=*/true);
      on_device.copy_(on_host, /*non_blocking=*/true);
    }
    impl.synchronizeStream(side);
    const std::chrono::duration<double> seconds = std::chrono::steady_clock::now() - start;
    rates.push_back(2.0 * static_cast<double>(bytes) / std::max(seconds.count(), 1e-9));
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
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
  inputs_ = inputs;
  label_ = std::make_unique<LabelScope>(next_region_label());
  group_ = std::make_shared<OffloadGroup>(
      offload_settings(options.offload_options(), "ckpt::checkpoint"));
  group_->keep_on_device(inputs);  // the caller holds them: a copy would be dropped at the end
  if (KeptReport* report = active_report()) record_ = std::make_unique<OffloadedRecord>(*report);
  scope_ =
      std::make_unique<SavedTensorHooksScope>([group = group_] { return offload_hooks(group); });
}

void OffloadedRegion::finish(const std::vector<at::Tensor>& outputs) {
  scope_.reset();
  std::vector<at::Tensor> resident = inputs_;
  resident.insert(resident.end(), outputs.begin(), outputs.end());
  group_->finish_forward(resident);
  if (record_) record_->finish(*group_, inputs_);
  record_.reset();
  inputs_.clear();
  label_.reset();
}

OffloadedRegion::~OffloadedRegion() {
  if (!scope_) return;
  record_.reset();  // the function threw: a region that failed records nothing
  finish({});
}

}  // namespace detail
}  // namespace ckpt
