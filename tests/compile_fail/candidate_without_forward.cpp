// A container's element as it indexes (a std::shared_ptr<torch::nn::Module>, which has no
// forward) passed to ckpt::candidate: one short message, not pages of template errors.
#include <ckpt/candidate.h>

#include <torch/nn/modules/linear.h>

at::Tensor misuse(torch::nn::ModuleList& layers, const at::Tensor& x) {
  return ckpt::candidate(layers[0], x);
}
