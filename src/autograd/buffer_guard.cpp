#include "buffer_guard.h"

#include <ATen/core/grad_mode.h>

namespace ckpt {
namespace detail {

BufferGuard::BufferGuard(const std::vector<std::shared_ptr<torch::nn::Module>>& modules) {
  for (const auto& module : modules) {
    for (const auto& buffer : module->buffers(/*recurse=*/true)) {
      if (!buffer.defined()) continue;
      buffers_.push_back(buffer);
      saved_.push_back(buffer.clone());
    }
  }
}

BufferGuard::~BufferGuard() {
  at::NoGradGuard no_grad;
  // Write through an alias with its own version counter: the recompute's graph saved these
  // buffers (BatchNorm saves its running statistics), and a version bump would make its backward
  // refuse them.
  for (size_t i = 0; i < buffers_.size(); ++i) buffers_[i].variable_data().copy_(saved_[i]);
}

}  // namespace detail
}  // namespace ckpt
