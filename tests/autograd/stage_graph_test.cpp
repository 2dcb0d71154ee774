// A chain's stage run on its own (the executor's unit): its backward holds what autograd's
// backward of the same layers holds, no more.

#include "autograd/stage_graph.h"
#include "support/support.h"

namespace stage_graph_test {

// The stage's output lives on in its backward only where the stage saved it, and the output's
// gradient until the node that reads it has run: a Linear saves its input and weight, so both are
// free before the weight's gradient is made. Each, held until the backward's end, was one
// output-sized tensor above autograd's peak in the backward of every stage (issue 48).
TEST(StageGraphTest, TheOutputIsLetGoOfWhenItsBackwardStarts) {
  torch::nn::Linear linear(8, 32);
  torch::nn::AnyModule stage(linear);
  const torch::Tensor x = torch::randn({4, 8});
  ckpt::detail::StageGraph graph(
      [&](const at::Tensor& input) { return stage.forward<at::Tensor>(input); }, x,
      /*input_requires_grad=*/true);
  const c10::Storage output = graph.output().storage();
  torch::Tensor grad_output = torch::ones({4, 32});
  const c10::Storage grad_output_memory = grad_output.storage();
  long output_holders = -1, grad_output_holders = -1;
  linear->weight.register_hook([&](const torch::Tensor&) {
    if (output_holders >= 0) return;
    output_holders = static_cast<long>(output.use_count());
    grad_output_holders = static_cast<long>(grad_output_memory.use_count());
  });
  const torch::Tensor input_grad = graph.backward(std::move(grad_output), true);
  EXPECT_EQ(output_holders, 1) << "only this test holds the output's memory";
  EXPECT_EQ(grad_output_holders, 1) << "and the gradient's, once the Linear's backward read it";
  torch::Tensor reference = x.detach().requires_grad_();
  linear->forward(reference).backward(torch::ones({4, 32}));
  EXPECT_TRUE(ckpt::test::bit_equal(input_grad, reference.grad()));
}

}  // namespace stage_graph_test
