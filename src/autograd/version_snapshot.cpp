#include "version_snapshot.h"

#include <c10/util/Exception.h>

#include <sstream>

namespace ckpt {
namespace detail {

void VersionSnapshot::add(const at::Tensor& tensor) {
  // Inference tensors have no version counter, and cannot be written outside InferenceMode.
  const bool tracked = tensor.defined() && !tensor.is_inference();
  tensors_.push_back(tracked ? tensor : at::Tensor());
  counters_.push_back(tracked ? tensor.unsafeGetTensorImpl()->version_counter()
                              : c10::VariableVersion(c10::VariableVersion::DISABLED));
  versions_.push_back(tracked ? counters_.back().current_version() : 0);
}

void VersionSnapshot::check(const char* api,
                            const std::function<std::string(size_t)>& describe) const {
  for (size_t i = 0; i < counters_.size(); ++i) {
    if (!changed(i)) continue;
    TORCH_CHECK(false, api, ": ", describe(i),
                ", which the checkpointed computation reads again in the backward pass, was "
                "modified in place after the forward pass (its version went from ",
                versions_[i], " to ", counters_[i].current_version(),
                "), so recomputing would give wrong gradients. Modify it (an optimizer step, "
                "say) only after the backward pass, or pass a clone.");
  }
}

void VersionSnapshot::clear() {
  tensors_.clear();
  counters_.clear();
  versions_.clear();
}

std::string describe_shape(const at::Tensor& tensor) {
  std::ostringstream out;
  out << "a tensor of shape " << tensor.sizes();
  return out.str();
}

}  // namespace detail
}  // namespace ckpt
