// Region arguments computed again instead of held (`detail::RegionRequest`, what
// ckpt::PlannedModel asks of its "recomputed" candidates): a region drops an argument that
// another region returned, and its recompute runs that region's function again to get it. The
// step must stay the plain step to the bit (outputs, gradients, BatchNorm statistics, dropout
// masks), and the dropped tensor's memory must really be free until the backward.

#include <ckpt/checkpoint.h>

#include "support/support.h"

#include <c10/util/intrusive_ptr.h>

#include <memory>
#include <optional>
#include <utility>
#include <vector>

namespace recomputed_input_test {

using ckpt::detail::RecomputeSource;
using ckpt::detail::RegionRequest;
using ckpt::test::bit_equal;
using ckpt::test::take_grads;
using Source = std::shared_ptr<const RecomputeSource>;

// Linear, BatchNorm (running statistics move in the forward), dropout (the RNG must be replayed).
struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(int64_t inputs = 1)
      : linear(register_module("linear", torch::nn::Linear(8 * inputs, 8))),
        bn(register_module("bn", torch::nn::BatchNorm1d(8))) {}
  torch::Tensor forward(const std::vector<torch::Tensor>& xs) {
    return torch::dropout(torch::tanh(bn(linear(torch::cat(xs, 1)))), 0.3, is_training());
  }
  torch::nn::Linear linear;
  torch::nn::BatchNorm1d bn;
};
TORCH_MODULE(Block);

// Runs `block` on `xs` as a checkpointed region that drops the arguments whose `sources` are
// set, and makes its output recomputable: the output and its source.
std::pair<torch::Tensor, Source> run(Block& block, const std::vector<torch::Tensor>& xs,
                                     std::vector<Source> sources) {
  RegionRequest request;
  request.input_sources = std::move(sources);
  request.recomputable_outputs = true;
  torch::Tensor y;
  {
    const ckpt::detail::RegionRequestScope requested(request);
    y = ckpt::checkpoint(block, xs);
  }
  EXPECT_EQ(request.output_sources.size(), 1u);
  return {y, request.output_sources.empty() ? nullptr : request.output_sources[0]};
}

struct Step {
  torch::Tensor loss, input_grad;
  std::vector<torch::Tensor> grads, buffers;
};

std::vector<Block> make_blocks() {
  torch::manual_seed(0);
  return {Block(), Block(), Block(), Block(2)};
}

// A chain of three blocks and a fourth that also takes the first's output (a skip):
// y = d(c(b(a(x))), a(x)). `recompute`: every region drops the arguments a region returned.
Step step(std::vector<Block> blocks, bool checkpointed, bool recompute) {
  torch::manual_seed(7);
  auto x = torch::randn({6, 8}, torch::requires_grad());
  torch::Tensor y;
  if (!checkpointed) {
    auto a = blocks[0]->forward({x});
    y = blocks[3]->forward({blocks[2]->forward({blocks[1]->forward({a})}), a});
  } else {
    auto drop = [&](const Source& s) { return recompute ? s : nullptr; };
    auto [a, sa] = run(blocks[0], {x}, {});
    auto [b, sb] = run(blocks[1], {a}, {drop(sa)});
    auto [c, sc] = run(blocks[2], {b}, {drop(sb)});
    y = run(blocks[3], {c, a}, {drop(sc), drop(sa)}).first;
  }
  auto loss = y.pow(2).sum();
  loss.backward();
  Step result{loss.detach(), x.grad(), {}, {}};
  for (auto& block : blocks) {
    for (auto& g : take_grads(*block)) result.grads.push_back(g);
    for (auto& b : block->buffers()) result.buffers.push_back(b.clone());
  }
  return result;
}

void expect_same(const Step& a, const Step& b) {
  EXPECT_TRUE(bit_equal(a.loss, b.loss));
  EXPECT_TRUE(bit_equal(a.input_grad, b.input_grad));
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t i = 0; i < a.grads.size(); ++i) EXPECT_TRUE(bit_equal(a.grads[i], b.grads[i])) << i;
  ASSERT_EQ(a.buffers.size(), b.buffers.size());
  for (size_t i = 0; i < a.buffers.size(); ++i) {
    EXPECT_TRUE(bit_equal(a.buffers[i], b.buffers[i])) << "buffer " << i;
  }
}

TEST(RecomputedInput, StepIsThePlainStepToTheBit) {
  const Step plain = step(make_blocks(), /*checkpointed=*/false, false);
  expect_same(plain, step(make_blocks(), /*checkpointed=*/true, /*recompute=*/false));
  // Chains of dropped arguments (c's comes from b, whose own comes from a) and a skip taken by
  // two regions: BatchNorm statistics still move once, dropout draws the forward's masks.
  expect_same(plain, step(make_blocks(), /*checkpointed=*/true, /*recompute=*/true));
}

// The tensor between two regions is freed once the caller lets go of it when the second region
// drops it, and held until the backward otherwise.
TEST(RecomputedInput, DroppedArgumentIsFreedUntilTheBackward) {
  for (const bool recompute : {false, true}) {
    std::vector<Block> blocks = make_blocks();
    auto x = torch::randn({6, 8}, torch::requires_grad());
    torch::Tensor c;
    std::optional<c10::weak_intrusive_ptr<c10::StorageImpl>> between;
    {
      auto [a, sa] = run(blocks[0], {x}, {});
      between.emplace(a.storage().getWeakStorageImpl());
      c = run(blocks[1], {a}, {recompute ? sa : nullptr}).first;
    }
    EXPECT_EQ(between->expired(), recompute);
    c.sum().backward();
    EXPECT_TRUE(x.grad().defined());
  }
}

// A dropped argument whose region's backward already ran (a separate backward through that
// region's output alone) cannot be computed again: a clear error, not a wrong gradient.
TEST(RecomputedInput, SourceFreedByAnEarlierBackwardIsAClearError) {
  std::vector<Block> blocks = make_blocks();
  auto x = torch::randn({6, 8}, torch::requires_grad());
  auto [a, sa] = run(blocks[0], {x}, {});
  auto b = run(blocks[1], {a}, {sa}).first;
  a.sum().backward();
  a = torch::Tensor();
  CKPT_EXPECT_THROWS_WITH(b.sum().backward(), "that region's backward already ran");
}

// A dropped argument is computed again from its region's arguments and whatever else that region
// read: a captured tensor written since is an error before the value is computed, so that no
// gradient taken through other values reaches the taker's parameters first.
TEST(RecomputedInput, ACapturedTensorWrittenBeforeTheRecomputeIsAnErrorFirst) {
  std::vector<Block> blocks = make_blocks();
  const torch::Tensor shift = torch::ones({8});
  const auto x = torch::randn({6, 8}, torch::requires_grad());
  RegionRequest request;
  request.recomputable_outputs = true;
  torch::Tensor a;
  {
    const ckpt::detail::RegionRequestScope requested(request);
    a = ckpt::checkpoint([&](const torch::Tensor& t) { return torch::sin(t + shift); }, x);
  }
  ASSERT_EQ(request.output_sources.size(), 1u);
  const torch::Tensor b = run(blocks[1], {a}, {request.output_sources[0]}).first;
  a = torch::Tensor();
  shift.add_(1);
  CKPT_EXPECT_THROWS_WITH(b.sum().backward(), "that the region's function read (aten::add)");
  EXPECT_FALSE(blocks[1]->linear->weight.grad().defined());
}

}  // namespace recomputed_input_test
