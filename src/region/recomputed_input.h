#pragma once

// Region arguments that a region does not hold between its forward and its backward, but
// computes again from the region that returned them, when a planner asks for it
// (`RegionRequest`): the memory of a tensor passed from one checkpointed block to the next is
// then free until the backward needs it.

#include <ckpt/detail/region.h>

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/edge.h>

#include <cstddef>
#include <memory>
#include <unordered_map>
#include <vector>

namespace ckpt {
namespace detail {

struct RegionState;

/// Output `output` (traversal order) of a finished non-reentrant region.
class RecomputeSource {
 public:
  RecomputeSource(std::shared_ptr<const RegionState> region, size_t output);
  /// The output's value as the forward computed it, without history: the region's function run
  /// again under no-grad with its forward's RNG, autocast state and training modes, its modules'
  /// buffers left as they were. Inside a `RecomputedValues` scope each region runs at most once.
  at::Tensor value() const;
  /// Notes the version of `tensor`, the output as its candidate returned it.
  void note_returned(const at::Tensor& tensor) const { returned_version_ = tensor._version(); }
  /// Whether `tensor`, that output, was written in place since it was returned: its value is then
  /// no longer the one `value()` computes.
  bool written_since_returned(const at::Tensor& tensor) const {
    return tensor._version() != returned_version_;
  }

 private:
  std::shared_ptr<const RegionState> region_;
  size_t output_;
  mutable int64_t returned_version_ = -1;
};

/// An argument a region dropped: where its value comes from and where its gradient goes.
struct DroppedInput {
  std::shared_ptr<const RecomputeSource> source;
  torch::autograd::Edge edge;  // the argument's gradient edge in the forward

  /// The argument again: the source's value with the forward's gradient edge, so that the
  /// recomputed graph leads where the forward's did.
  at::Tensor materialize() const;
};

/// For its lifetime, the values sources compute on the calling thread are shared: a region that
/// several dropped arguments come from (directly or through other sources) runs once.
class RecomputedValues {
 public:
  RecomputedValues();
  ~RecomputedValues();
  RecomputedValues(const RecomputedValues&) = delete;
  RecomputedValues& operator=(const RecomputedValues&) = delete;

  /// The values of `region`'s outputs computed in this scope, or nullptr.
  static std::vector<at::Tensor>* find(const RegionState* region);
  static void add(const RegionState* region, std::vector<at::Tensor> values);

 private:
  RecomputedValues* previous_;
  std::unordered_map<const RegionState*, std::vector<at::Tensor>> values_;
};

/// The request the calling thread's next region takes (nullptr: none); it is taken.
RegionRequest* take_region_request();

}  // namespace detail
}  // namespace ckpt
