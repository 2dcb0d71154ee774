#pragma once

// What the profilers of chains and of any model share: the clock, medians, storage sizes, and the
// gradients a measured step starts from.

#include "compat/torch_compat.h"
#include "measure/meta_memory.h"

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <unordered_set>
#include <vector>

namespace ckpt {
namespace detail {

using Clock = std::chrono::steady_clock;

// The profilers' clock on `device`, once it has finished the work queued on it: host time, or,
// on the meta device, the time a `ModeledDevice`'s cost model charged.
inline Clock::time_point clock_now(c10::Device device) {
  if (device.is_meta()) {
    return Clock::time_point(std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(modeled_seconds())));
  }
  compat::synchronize(device);
  return Clock::now();
}

inline double seconds_since(Clock::time_point start, c10::Device device) {
  return std::chrono::duration<double>(clock_now(device) - start).count();
}

inline double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

// What one allocation on `device` is counted in multiples of: the CPU's counting allocator counts
// the bytes asked for; CUDA's caching allocator hands out 512-byte blocks (the emulated device
// counts as it does); the meta device as the modeled device's allocator rounds.
inline int64_t allocation_granularity(c10::Device device) {
  if (device.is_cpu()) return 1;
  return device.is_meta() ? meta_granularity() : 512;
}

// The bytes an allocation of `bytes` takes on `device`, as its allocator counts them.
inline int64_t allocated_bytes(int64_t bytes, c10::Device device) {
  const int64_t unit = allocation_granularity(device);
  return (bytes + unit - 1) / unit * unit;
}

// The bytes `t`'s storage takes on its device.
inline int64_t allocated_storage_bytes(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return 0;
  return allocated_bytes(static_cast<int64_t>(t.storage().nbytes()), t.device());
}

// The bytes a new tensor like `t` (its gradient, say) takes on its device.
inline int64_t allocated_bytes_of(const at::Tensor& t) {
  return allocated_bytes(static_cast<int64_t>(t.numel()) * static_cast<int64_t>(t.element_size()),
                         t.device());
}

// Swaps every parameter's `.grad` for the state a step starts from, for its lifetime, and puts
// the original gradients back afterwards. `ZeroBuffers`: the steady state of a loop that keeps
// its buffers (backward accumulates in place). `None`: as `zero_grad()` leaves them (backward
// creates them). A parameter shared by several modules (a tied weight) is handled once, so that
// its own gradient is what comes back.
class SwappedGradients {
 public:
  enum class Start { ZeroBuffers, None };

  SwappedGradients(const std::vector<std::shared_ptr<torch::nn::Module>>& modules, Start start) {
    std::unordered_set<const c10::TensorImpl*> seen;
    for (const auto& module : modules) {
      for (auto& p : module->parameters()) {
        if (!seen.insert(p.unsafeGetTensorImpl()).second) continue;
        params_.push_back(p);
        saved_.push_back(p.grad());
        const bool buffer = start == Start::ZeroBuffers && p.requires_grad();
        p.mutable_grad() = buffer ? at::zeros_like(p) : at::Tensor();
      }
    }
  }
  /// The gradients of `leaves` (tensors outside the measured modules that a step's backward
  /// accumulates into: the input, a loss's own parameters), none during the step.
  explicit SwappedGradients(std::vector<at::Tensor> leaves) : params_(std::move(leaves)) {
    for (auto& leaf : params_) {
      saved_.push_back(leaf.grad());
      leaf.mutable_grad() = at::Tensor();
    }
  }
  ~SwappedGradients() {
    for (size_t i = 0; i < params_.size(); ++i) params_[i].mutable_grad() = saved_[i];
  }
  SwappedGradients(const SwappedGradients&) = delete;
  SwappedGradients& operator=(const SwappedGradients&) = delete;

 private:
  std::vector<at::Tensor> params_, saved_;
};

}  // namespace detail
}  // namespace ckpt
