#include "recomputed_input.h"

#include "region_state.h"

#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/variable.h>

#include <utility>

namespace ckpt {
namespace detail {
namespace {

thread_local RegionRequest* pending_request = nullptr;
thread_local RecomputedValues* current_values = nullptr;

}  // namespace

RegionRequestScope::RegionRequestScope(RegionRequest& request) {
  pending_request = &request;
}

RegionRequestScope::~RegionRequestScope() {
  pending_request = nullptr;
}

RegionRequest* take_region_request() {
  return std::exchange(pending_request, nullptr);
}

RecomputeSource::RecomputeSource(std::shared_ptr<const RegionState> region, size_t output)
    : region_(std::move(region)), output_(output) {}

at::Tensor RecomputeSource::value() const {
  if (std::vector<at::Tensor>* values = RecomputedValues::find(region_.get())) {
    return values->at(output_);
  }
  std::vector<at::Tensor> values = region_->recompute_values();
  at::Tensor result = values.at(output_);
  RecomputedValues::add(region_.get(), std::move(values));
  return result;
}

at::Tensor DroppedInput::materialize() const {
  at::Tensor value = source->value();
  if (!edge.is_valid()) return value;
  // A tensor of its own, so that the gradient edge set here is nobody else's.
  at::Tensor argument = value.variable_data();
  torch::autograd::impl::set_gradient_edge(argument, edge);
  return argument;
}

RecomputedValues::RecomputedValues() : previous_(std::exchange(current_values, this)) {}

RecomputedValues::~RecomputedValues() {
  current_values = previous_;
}

std::vector<at::Tensor>* RecomputedValues::find(const RegionState* region) {
  if (current_values == nullptr) return nullptr;
  const auto found = current_values->values_.find(region);
  return found == current_values->values_.end() ? nullptr : &found->second;
}

void RecomputedValues::add(const RegionState* region, std::vector<at::Tensor> values) {
  if (current_values != nullptr) current_values->values_[region] = std::move(values);
}

}  // namespace detail
}  // namespace ckpt
