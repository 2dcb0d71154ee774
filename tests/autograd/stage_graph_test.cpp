// A chain's stage run on its own (the executor's unit): its backward holds what autograd's
// backward of the same layers holds, no more.

#include "autograd/stage_graph.h"
#include "support/support.h"

namespace stage_graph_test {

// The stage's output lives on in its backward only where the stage saved it: a Linear saves its
// input and weight, so the output's memory is free before the weight's gradient is made. Held
// until the backward's end, it was one output-sized tensor above autograd's peak in every stage
// that does not save its output (each block of the bench ResNet, issue 48).
TEST(StageGraphTest, TheOutputIsLetGoOfWhenItsBackwardStarts) {
  torch::nn::Linear linear(8, 32);
  torch::nn::AnyModule stage(linear);
  const torch::Tensor x = torch::randn({4, 8});
  ckpt::detail::StageGraph graph(
      [&](const at::Tensor& input) { return stage.forward<at::Tensor>(input); }, x,
      /*input_requires_grad=*/true);
  const c10::Storage output = graph.output().storage();
  long holders_in_backward = -1;
  linear->weight.register_hook([&](const torch::Tensor&) {
    if (holders_in_backward < 0) holders_in_backward = static_cast<long>(output.use_count());
  });
  const torch::Tensor input_grad = graph.backward(torch::ones({4, 32}), true);
  EXPECT_EQ(holders_in_backward, 1) << "only this test holds the output's memory";
  torch::Tensor reference = x.detach().requires_grad_();
  linear->forward(reference).backward(torch::ones({4, 32}));
  EXPECT_TRUE(ckpt::test::bit_equal(input_grad, reference.grad()));
}

}  // namespace stage_graph_test
