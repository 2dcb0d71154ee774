// A chain's stage run on its own (the executor's unit): its backward holds what autograd's
// backward of the same layers holds, no more.

#include "autograd/stage_graph.h"
#include "support/support.h"

#include <ckpt/checkpoint.h>

namespace stage_graph_test {

// The stage's output lives on in its backward only where the stage saved it, and the output's
// gradient until the node that reads it has run: a Linear saves its input and weight, so both are
// free before the weight's gradient is made. Each, held until the backward's end, was one
// output-sized tensor above autograd's peak in the backward of every stage (issue 48).
TEST(StageGraphTest, TheOutputIsLetGoOfWhenItsBackwardStarts) {
  torch::nn::Linear linear(8, 32);
  torch::nn::AnyModule stage(linear);
  const torch::Tensor x = torch::randn({4, 8});
  c10::Storage output;
  torch::Tensor grad_output = torch::ones({4, 32});
  const c10::Storage grad_output_memory = grad_output.storage();
  long output_holders = -1, grad_output_holders = -1;
  // The stage is tanh(linear(x)); the hook on the Linear's output runs once tanh's backward,
  // which read the output and its gradient, has run.
  ckpt::detail::StageGraph graph(
      [&](const at::Tensor& input) {
        at::Tensor hidden = stage.forward<at::Tensor>(input);
        hidden.register_hook([&](const at::Tensor&) {
          output_holders = static_cast<long>(output.use_count());
          grad_output_holders = static_cast<long>(grad_output_memory.use_count());
        });
        return at::tanh(hidden);
      },
      x, /*input_requires_grad=*/true);
  output = graph.output().storage();
  ckpt::detail::LeafGradients leaves(ckpt::detail::single_stage_leaves({stage}));
  const torch::Tensor input_grad = graph.backward(std::move(grad_output), leaves);
  leaves.accumulate_rest();
  EXPECT_EQ(output_holders, 1) << "only this test holds the output's memory";
  EXPECT_EQ(grad_output_holders, 1) << "and the gradient's, once tanh's backward read it";
  torch::Tensor reference = x.detach().requires_grad_();
  at::tanh(linear->forward(reference)).backward(torch::ones({4, 32}));
  EXPECT_TRUE(ckpt::test::bit_equal(input_grad, reference.grad()));
}

// The same for a stage run as a checkpointed region: its node's gradient lives until the recomputed
// node that reads it has run. The capture of the stage's border was an engine post-hook on the
// region's node, and LibTorch keeps a node's inputs while it runs where it has post-hooks: the
// output's gradient was held through the region's whole recompute and backward, one output more
// than the plain stage at the peak (the recursive U-Net's first step: 1.034 times the plain step).
TEST(StageGraphTest, ACheckpointedStageLetsGoOfItsOutputsGradient) {
  torch::nn::Linear first(8, 32), second(32, 32);
  const torch::Tensor x = torch::randn({4, 8});
  torch::Tensor grad_output = torch::ones({4, 32});
  const c10::Storage grad_output_memory = grad_output.storage();
  long grad_output_holders = -1;
  ckpt::detail::StageGraph graph(
      [&](const at::Tensor& input) {
        return ckpt::checkpoint(
            [&](const at::Tensor& in) {
              at::Tensor hidden = first->forward(in);
              // Registered again on the recomputed tensor; runs after second's backward.
              if (hidden.requires_grad()) {
                hidden.register_hook([&](const at::Tensor&) {
                  grad_output_holders = static_cast<long>(grad_output_memory.use_count());
                });
              }
              return at::gelu(second->forward(at::relu(hidden)));
            },
            input);
      },
      x, /*input_requires_grad=*/true);
  ckpt::detail::LeafGradients leaves;
  const torch::Tensor input_grad = graph.backward(std::move(grad_output), leaves);
  leaves.accumulate_rest();
  EXPECT_EQ(grad_output_holders, 1) << "only this test holds the gradient's memory";
  torch::Tensor reference = x.detach().requires_grad_();
  at::gelu(second->forward(at::relu(first->forward(reference)))).backward(torch::ones({4, 32}));
  EXPECT_TRUE(ckpt::test::bit_equal(input_grad, reference.grad()));
}

}  // namespace stage_graph_test
