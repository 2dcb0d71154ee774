#pragma once

// The version counters of the tensors a recomputation reads again, taken after the forward pass.
// Plain autograd raises when a tensor it saved is modified in place before the backward; a
// recomputation would silently read the new values instead (an optimizer step between forward
// and backward, say), so ckpt checks these counters before it recomputes.

#include <ATen/core/Tensor.h>
#include <c10/core/TensorImpl.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ckpt {
namespace detail {

class VersionSnapshot {
 public:
  /// Records `tensor` at its current version (an undefined or inference tensor takes a place but
  /// is never checked: it has no version counter).
  void add(const at::Tensor& tensor);
  /// Stops holding tensor i, which is still checked: its version counter keeps no data alive.
  void let_go(size_t i) { tensors_.at(i) = at::Tensor(); }

  /// Raises a c10::Error naming the first tensor whose version changed since it was added:
  /// "`api`: <describe(i)> ... was modified in place after the forward pass ...". `describe`
  /// names tensor i (in the order added), e.g. "tensor argument #0".
  void check(const char* api, const std::function<std::string(size_t)>& describe) const;

  /// Whether tensor i (tracked) was modified in place since it was added.
  bool changed(size_t i) const {
    return counters_[i].enabled() && counters_[i].current_version() != versions_[i];
  }
  size_t size() const { return tensors_.size(); }
  /// Tensor i, undefined where it was let go of.
  const at::Tensor& tensor(size_t i) const { return tensors_[i]; }
  void clear();

 private:
  std::vector<at::Tensor> tensors_;
  std::vector<c10::VariableVersion> counters_;  // disabled where untracked
  std::vector<uint32_t> versions_;
};

/// Tensors read from outside a region, by their version counters alone (a counter holds no data),
/// each named by its sizes and the operator that read it.
class ReadVersions {
 public:
  /// Records a tensor by its version counter, at the counter's current version.
  void add(const c10::VariableVersion& counter, std::vector<int64_t> sizes, std::string reader);
  /// Raises a c10::Error as `VersionSnapshot::check` does, naming the first tensor written since.
  void check(const char* api) const;
  void clear() { entries_.clear(); }

 private:
  struct Entry {
    c10::VariableVersion counter;
    uint32_t version = 0;
    std::vector<int64_t> sizes;
    std::string reader;
  };
  std::vector<Entry> entries_;
};

/// "a tensor of shape [2, 3]", for messages.
std::string describe_shape(const at::Tensor& tensor);

}  // namespace detail
}  // namespace ckpt
