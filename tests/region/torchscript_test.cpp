// Issue 46, item 3: a region around TorchScript code. The profiling graph executor runs a
// function's first calls as they are written and then a graph specialised from what it saw, with
// other autograd nodes (a differentiable graph's), so the recompute may build a graph of another
// shape than the forward's: the gradients are still the function's, and ckpt does not refuse them.

#include <ckpt/ckpt.h>

#include <torch/jit.h>

#include "support/support.h"

#include <memory>

namespace torchscript_test {

using ckpt::test::close;

const char* const kScriptedBlock = R"(
def block(x, w1, w2):
    h = torch.tanh(torch.matmul(x, w1))
    return torch.sin(torch.matmul(h, w2)) * 2.0
)";

TEST(TorchScriptRegion, EveryStepOfTheExecutorGivesTheFunctionsGradients) {
  const std::shared_ptr<torch::jit::CompilationUnit> unit = torch::jit::compile(kScriptedBlock);
  torch::jit::Function& block = unit->get_function("block");
  torch::manual_seed(1);
  const auto w1 = torch::randn({8, 16}, torch::requires_grad());
  const auto w2 = torch::randn({16, 8}, torch::requires_grad());
  const auto x = torch::randn({4, 8});
  const auto run = [&](const at::Tensor& input) { return block({input, w1, w2}).toTensor(); };
  // Eager autograd's gradients of the same function, the reference at every step.
  const auto h = torch::tanh(x.matmul(w1));
  const auto plain =
      torch::autograd::grad({(torch::sin(h.matmul(w2)) * 2.0).pow(2).sum()}, {w1, w2});
  // The executor profiles the first calls and specialises after: steps through both phases.
  for (int step = 0; step < 6; ++step) {
    SCOPED_TRACE(step);
    const auto input = x.detach().requires_grad_();
    const auto grads = torch::autograd::grad({ckpt::checkpoint(run, input).pow(2).sum()}, {w1, w2});
    EXPECT_TRUE(close(grads[0], plain[0]));
    EXPECT_TRUE(close(grads[1], plain[1]));
  }
}

}  // namespace torchscript_test
