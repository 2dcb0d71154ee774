#include "step_rollback.h"

#include <torch/nn/module.h>

namespace ckpt {
namespace detail {
namespace {

RngStash stash_for(const torch::nn::Module& model) {
  const std::vector<at::Tensor> parameters = model.parameters();
  return RngStash(parameters, infer_device_type(parameters));
}

}  // namespace

StepRollback::StepRollback(const std::shared_ptr<torch::nn::Module>& model)
    : rng_(stash_for(*model)), buffers_({model}) {}

StepRollback::~StepRollback() {
  if (rng_) rng_->restore();
}

void StepRollback::dismiss() {
  rng_.reset();
  buffers_.dismiss();
}

}  // namespace detail
}  // namespace ckpt
