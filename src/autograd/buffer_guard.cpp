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

BuffersAtForward::BuffersAtForward(const std::vector<std::shared_ptr<torch::nn::Module>>& modules,
                                   uint64_t copy) {
  for (const auto& module : modules) {
    for (const auto& buffer : module->buffers(/*recurse=*/true)) {
      if (!buffer.defined()) continue;
      const bool copied = (copy & site_bit(buffers_.size())) != 0;
      buffers_.push_back(buffer);
      versions_.push_back(buffer._version());
      copies_.push_back(copied ? buffer.clone() : at::Tensor());
    }
  }
}

uint64_t BuffersAtForward::finish() {
  uint64_t written = 0;
  for (size_t i = 0; i < buffers_.size(); ++i) {
    if (buffers_[i]._version() == versions_[i]) {
      copies_[i] = at::Tensor();
      continue;
    }
    written |= site_bit(i);
    lost_ = lost_ || !copies_[i].defined();
  }
  return written;
}

void BuffersAtForward::restore() const {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < buffers_.size(); ++i) {
    if (copies_[i].defined()) buffers_[i].variable_data().copy_(copies_[i]);
  }
}

}  // namespace detail
}  // namespace ckpt
