#include "stage_graph.h"

#include "module_region.h"
#include "region/graph.h"

#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/variable.h>

namespace ckpt {
namespace detail {

StageGraph::StageGraph(torch::nn::AnyModule& stage, const at::Tensor& input,
                       bool input_requires_grad, const CheckpointOptions* region) {
  const at::AutoGradMode grad_mode(true);
  leaf_ = input.detach();
  if (input_requires_grad) leaf_.requires_grad_(true);
  const RegionMarker marker;
  if (region != nullptr) {
    auto module = stage;
    output_ = checkpoint_modules(
        *region, {module.ptr()},
        [module](const at::Tensor& x) mutable { return module.forward<at::Tensor>(x); }, leaf_);
  } else {
    output_ = stage.forward<at::Tensor>(leaf_);
  }
  if (!output_.requires_grad()) return;
  boundary_ = find_boundary_edges({torch::autograd::impl::gradient_edge(output_)}, marker);
  for (const auto& edge : boundary_) {
    // Stages built from modules reach only leaves (their input and parameters). A non-leaf tensor
    // from outside the stage would make the stage's backward run the graph before it.
    TORCH_CHECK(dynamic_cast<torch::autograd::AccumulateGrad*>(edge.function.get()) != nullptr,
                "ckpt: a stage of the chain uses a tensor that requires grad, was computed outside "
                "the stage (",
                edge.function->name(),
                "), and is neither the stage's input nor a parameter. Pass it to the stage as a "
                "parameter or buffer, or detach it.");
  }
}

at::Tensor StageGraph::backward(at::Tensor grad_output, bool accumulate_parameters) {
  at::Tensor input_grad;
  if (output_.requires_grad() && grad_output.defined()) {
    auto& engine = torch::autograd::Engine::get_default_engine();
    const torch::autograd::edge_list roots = {torch::autograd::impl::gradient_edge(output_)};
    if (accumulate_parameters) {
      engine.execute(roots, {std::move(grad_output)}, /*keep_graph=*/false,
                     /*create_graph=*/false, /*accumulate_grad=*/true, boundary_);
      if (leaf_.requires_grad()) input_grad = leaf_.grad();
    } else if (leaf_.requires_grad()) {
      input_grad = engine.execute(roots, {std::move(grad_output)}, /*keep_graph=*/false,
                                  /*create_graph=*/false, /*accumulate_grad=*/false,
                                  {torch::autograd::impl::gradient_edge(leaf_)})[0];
    }
  }
  leaf_.reset();
  output_.reset();
  boundary_.clear();
  return input_grad;
}

}  // namespace detail
}  // namespace ckpt
