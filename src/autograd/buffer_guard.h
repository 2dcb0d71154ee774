#pragma once

// Keeps a recompute from updating module buffers (BatchNorm's running statistics) a second time.

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <memory>
#include <vector>

namespace ckpt {
namespace detail {

/// Snapshots the buffers of `modules` and their submodules, and writes the snapshot back when
/// destroyed (also when an exception leaves the scope).
class BufferGuard {
 public:
  explicit BufferGuard(const std::vector<std::shared_ptr<torch::nn::Module>>& modules);
  ~BufferGuard();
  /// Leaves the buffers as they are now: nothing is written back.
  void dismiss() {
    buffers_.clear();
    saved_.clear();
  }
  BufferGuard(const BufferGuard&) = delete;
  BufferGuard& operator=(const BufferGuard&) = delete;

 private:
  std::vector<at::Tensor> buffers_;
  std::vector<at::Tensor> saved_;
};

}  // namespace detail
}  // namespace ckpt
