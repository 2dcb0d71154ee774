#pragma once

// One stage of a chain run with grad on, with its autograd graph kept apart from everything
// before it, so that its backward can be run on its own (the executor's Fall and B operations).

#include <ckpt/options.h>

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/function.h>
#include <torch/nn/modules/container/any.h>

namespace ckpt {
namespace detail {

class StageGraph {
 public:
  /// Runs `stage` on a detached alias of `input` (a leaf that requires grad when
  /// `input_requires_grad`) and keeps the graph. With `region` the stage runs as a checkpointed
  /// region with those options: the graph keeps its output (and what a selective policy saves),
  /// and its backward recomputes the rest (the planner's "checkpointed" and "selective" storage
  /// options).
  StageGraph(torch::nn::AnyModule& stage, const at::Tensor& input, bool input_requires_grad,
             const CheckpointOptions* region = nullptr);

  const at::Tensor& output() const { return output_; }

  /// Backward through the stage from `grad_output`; frees the graph and returns the gradient of
  /// the input (undefined when the input needs none). With `accumulate_parameters` (a plain
  /// backward) the gradients of parameters are accumulated into their `.grad` as autograd does;
  /// otherwise (inside `autograd::grad`) only the input's gradient is computed.
  at::Tensor backward(at::Tensor grad_output, bool accumulate_parameters);

 private:
  at::Tensor leaf_;
  at::Tensor output_;
  torch::autograd::edge_list boundary_;
};

}  // namespace detail
}  // namespace ckpt
