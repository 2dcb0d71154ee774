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

namespace {

[[noreturn]] void raise_modified(const char* api, const std::string& what, uint32_t from,
                                 uint32_t to) {
  TORCH_CHECK(false, api, ": ", what,
              ", which the checkpointed computation reads again in the backward pass, was "
              "modified in place after the forward pass (its version went from ",
              from, " to ", to,
              "), so recomputing would give wrong gradients. Modify it (an optimizer step, "
              "say) only after the backward pass, or pass a clone.");
}

}  // namespace

void VersionSnapshot::check(const char* api,
                            const std::function<std::string(size_t)>& describe) const {
  for (size_t i = 0; i < counters_.size(); ++i) {
    if (changed(i)) raise_modified(api, describe(i), versions_[i], counters_[i].current_version());
  }
}

void ReadVersions::add(const c10::VariableVersion& counter, std::vector<int64_t> sizes,
                       std::string reader) {
  entries_.push_back({counter, counter.current_version(), std::move(sizes), std::move(reader)});
}

void ReadVersions::check(const char* api) const {
  for (const Entry& entry : entries_) {
    const uint32_t now = entry.counter.current_version();
    if (now == entry.version) continue;
    std::ostringstream what;
    what << "a tensor of shape " << c10::IntArrayRef(entry.sizes) << " that the region's function "
         << "read (" << entry.reader
         << ") besides its arguments (a tensor it captures, or a buffer of "
         << "its modules)";
    raise_modified(api, what.str(), entry.version, now);
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
