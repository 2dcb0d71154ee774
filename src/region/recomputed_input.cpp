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
  if (current_values != nullptr) RecomputedValues::add(region_.get(), std::move(values));
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

void RecomputableOutputs::add(int producer, const std::vector<at::Tensor>& outputs,
                              const RegionRequest& request) {
  for (size_t i = 0; i < outputs.size() && i < request.output_sources.size(); ++i) {
    if (!request.output_sources[i] || !outputs[i].defined()) continue;
    c10::TensorImpl* impl = outputs[i].unsafeGetTensorImpl();
    entries_.insert_or_assign(
        impl, Entry{c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>(
                        outputs[i].getIntrusivePtr()),
                    request.output_sources[i], producer});
  }
}

std::vector<std::shared_ptr<const RecomputeSource>> RecomputableOutputs::sources_for(
    const std::vector<at::Tensor>& inputs, std::vector<int>& producers) const {
  std::vector<std::shared_ptr<const RecomputeSource>> sources(inputs.size());
  producers.assign(inputs.size(), -1);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined()) continue;
    const auto found = entries_.find(inputs[i].unsafeGetTensorImpl());
    // The address is the tensor's only while the tensor recorded there lives.
    if (found == entries_.end() ||
        found->second.tensor.lock().get() != inputs[i].unsafeGetTensorImpl())
      continue;
    sources[i] = found->second.source;
    producers[i] = found->second.producer;
  }
  return sources;
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
