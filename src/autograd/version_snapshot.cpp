#include "version_snapshot.h"

#include <c10/util/Exception.h>

#include <sstream>

namespace ckpt {
namespace detail {

void VersionSnapshot::add(const at::Tensor& tensor) {
  // Inference tensors have no version counter, and cannot be written outside InferenceMode.
  const bool tracked = tensor.defined() && !tensor.is_inference();
  tensors_.push_back(tracked ? tensor : at::Tensor());
  versions_.push_back(tracked ? tensor._version() : 0);
}

void VersionSnapshot::check(const char* api,
                            const std::function<std::string(size_t)>& describe) const {
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (!tensors_[i].defined()) continue;
    const int64_t now = tensors_[i]._version();
    TORCH_CHECK(now == versions_[i], api, ": ", describe(i),
                ", which the checkpointed computation reads again in the backward pass, was "
                "modified in place after the forward pass (its version went from ",
                versions_[i], " to ", now,
                "), so recomputing would give wrong gradients. Modify it (an optimizer step, "
                "say) only after the backward pass, or pass a clone.");
  }
}

void VersionSnapshot::clear() {
  tensors_.clear();
  versions_.clear();
}

std::string describe_shape(const at::Tensor& tensor) {
  std::ostringstream out;
  out << "a tensor of shape " << tensor.sizes();
  return out.str();
}

}  // namespace detail
}  // namespace ckpt
