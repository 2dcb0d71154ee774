// ckpt::profile_chain measures a stage once and reuses it for later stages whose forwards are the
// same (ProfileOptions::reuse_repeated_stages): the profile is the one measuring every stage gives,
// to the byte, and stages that only look the same are measured.

#include <ckpt/plan/simulator.h>
#include <ckpt/plan/solvers.h>
#include <ckpt/profiler.h>

#include "support/same_sizes.h"
#include "support/support.h"

#include <torch/csrc/autograd/custom_function.h>

namespace repeated_stages_test {

// Doubles its input. Its backward makes a scratch tensor 16 times the gradient's size where the
// forward stashed `scratch` (a flag no operator sees), so two such stages with the same forward
// differ in their backward's memory only.
struct Doubling : torch::autograd::Function<Doubling> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               bool scratch) {
    ctx->saved_data["scratch"] = scratch;
    return x * 2.0;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    torch::Tensor grad = grads[0] * 2.0;
    if (ctx->saved_data["scratch"].toBool()) {
      grad = grad + torch::zeros({16, grad.size(0), grad.size(1)}).sum(0);
    }
    return {grad, torch::Tensor()};
  }
};

enum class Variant {
  Plain,          // first(x) -> relu -> * 2.0 -> second -> * x
  KeepsPre,       // the same operators; keeps relu's input in a member: held bytes differ
  OtherScalar,    // * 3.0 instead of * 2.0
  OtherOrigin,    // * second(h) instead of * x: same shapes, another source (and graph)
  Hooked,         // a gradient hook on the hidden activation
  CustomPlain,    // Doubling in place of * 2.0, no scratch
  CustomScratch,  // Doubling with scratch in its backward
};

// A block whose forward counts its calls.
struct BlockImpl : torch::nn::Module {
  BlockImpl(int64_t width, Variant variant)
      : first(register_module("first", torch::nn::Linear(width, width))),
        second(register_module("second", torch::nn::Linear(width, width))),
        variant(variant) {}
  // A plain block of the same layers as `other` (the same parameters, its own call count).
  explicit BlockImpl(const BlockImpl& other)
      : torch::nn::Module(),
        first(register_module("first", other.first)),
        second(register_module("second", other.second)),
        variant(Variant::Plain) {}

  torch::Tensor forward(const torch::Tensor& x) {
    ++calls;
    const torch::Tensor pre = first(x);
    if (variant == Variant::KeepsPre) kept = pre;
    torch::Tensor h = torch::relu(pre);
    if (variant == Variant::Hooked && h.requires_grad())
      h.register_hook([](const torch::Tensor& grad) { return grad; });
    if (variant == Variant::CustomPlain || variant == Variant::CustomScratch) {
      h = Doubling::apply(h, variant == Variant::CustomScratch);
    } else {
      h = h * (variant == Variant::OtherScalar ? 3.0 : 2.0);
    }
    const torch::Tensor out = second(h);
    return out * (variant == Variant::OtherOrigin ? out : x);
  }

  torch::nn::Linear first, second;
  Variant variant;
  torch::Tensor kept;
  int calls = 0;
};
TORCH_MODULE(Block);

std::vector<torch::nn::AnyModule> stages_of(const std::vector<Block>& blocks) {
  std::vector<torch::nn::AnyModule> stages;
  for (const Block& block : blocks) stages.emplace_back(block);
  return stages;
}

ckpt::ProfileOptions options(bool reuse) {
  return ckpt::ProfileOptions()
      .storage_modes(ckpt::StorageModes::standard())
      .calibrate_to_step(false)
      .reuse_repeated_stages(reuse);
}

// Profiles `variants` as a chain twice, reusing and measuring every stage; returns the number of
// times each block's forward ran while the first profiled, and checks the two profiles' sizes.
std::vector<int> calls_while_reusing(const std::vector<Variant>& variants) {
  torch::manual_seed(0);
  std::vector<Block> blocks;
  for (const Variant variant : variants) blocks.emplace_back(32, variant);
  const std::vector<torch::nn::AnyModule> stages = stages_of(blocks);
  const torch::Tensor x = torch::randn({16, 32}, torch::requires_grad());
  const ckpt::plan::Chain reused = ckpt::profile_chain(stages, x, options(true));
  std::vector<int> calls;
  for (const Block& block : blocks) calls.push_back(block->calls);
  ckpt::test::expect_same_sizes(reused, ckpt::profile_chain(stages, x, options(false)));
  return calls;
}

// A stage taken over from an earlier one runs twice: its signature's forward and the forward
// that makes the next stage's input. One that is measured runs more.
constexpr int kReusedCalls = 2;

TEST(RepeatedStagesTest, LaterStagesOfAKindTakeTheFirstOnesMeasurement) {
  const std::vector<int> calls =
      calls_while_reusing({Variant::Plain, Variant::Plain, Variant::Plain, Variant::Plain});
  EXPECT_GT(calls[0], kReusedCalls);
  for (size_t i = 1; i < calls.size(); ++i) EXPECT_EQ(calls[i], kReusedCalls) << "stage " << i;
}

TEST(RepeatedStagesTest, ForwardsThatOnlyLookAlikeAreMeasured) {
  // Each differs from Plain in one thing: what it holds, a scalar, where an argument comes from.
  const std::vector<int> calls =
      calls_while_reusing({Variant::Plain, Variant::KeepsPre, Variant::OtherScalar,
                           Variant::OtherOrigin, Variant::Plain, Variant::KeepsPre});
  for (size_t i = 0; i < 4; ++i) EXPECT_GT(calls[i], kReusedCalls) << "stage " << i;
  EXPECT_EQ(calls[4], kReusedCalls);
  EXPECT_EQ(calls[5], kReusedCalls);
}

TEST(RepeatedStagesTest, CustomFunctionsAndHooksAreMeasuredEveryTime) {
  // The same forward and the same nodes, but a backward that depends on what the forward stashed
  // (CustomScratch after CustomPlain): only measuring tells them apart, so every stage with a
  // node of its own is measured; likewise a hook, which may keep what it sees.
  const std::vector<int> calls =
      calls_while_reusing({Variant::CustomPlain, Variant::CustomScratch, Variant::CustomPlain,
                           Variant::Hooked, Variant::Hooked});
  for (size_t i = 0; i < calls.size(); ++i) EXPECT_GT(calls[i], kReusedCalls) << "stage " << i;
}

TEST(RepeatedStagesTest, AStageWhoseParametersAnotherSharesIsMeasured) {
  torch::manual_seed(0);
  const Block shared(32, Variant::Plain);
  const Block other(32, Variant::Plain);
  const std::vector<torch::nn::AnyModule> stages = stages_of({shared, other, shared});
  const torch::Tensor x = torch::randn({16, 32}, torch::requires_grad());
  ckpt::test::expect_same_sizes(ckpt::profile_chain(stages, x, options(true)),
                                ckpt::profile_chain(stages, x, options(false)));
  // Two blocks of the same layers, each with its own count: the same record, but the executor
  // collects their gradients apart from single-stage ones, so both are measured.
  const Block first(32, Variant::Plain);
  const Block twin(*first);
  const ckpt::plan::Chain twins = ckpt::profile_chain(stages_of({first, twin}), x, options(true));
  EXPECT_GT(first->calls, kReusedCalls);
  EXPECT_GT(twin->calls, kReusedCalls);
  ckpt::test::expect_same_sizes(twins,
                                ckpt::profile_chain(stages_of({first, twin}), x, options(false)));
}

TEST(RepeatedStagesTest, ReusedStagesPlanAsMeasuredOnes) {
  // Sizes equal, the planner gets the same chain but for times; the plan's peak follows.
  torch::manual_seed(0);
  std::vector<Block> blocks;
  for (int i = 0; i < 6; ++i) blocks.emplace_back(64, Variant::Plain);
  const torch::Tensor x = torch::randn({32, 64}, torch::requires_grad());
  const auto reused = ckpt::profile_chain(stages_of(blocks), x, options(true));
  const auto measured = ckpt::profile_chain(stages_of(blocks), x, options(false));
  const auto smallest = [](const ckpt::plan::Chain& chain) {
    return ckpt::plan::simulate(chain, ckpt::plan::solve_min_memory(chain)).peak_bytes;
  };
  EXPECT_EQ(smallest(reused), smallest(measured));
}

}  // namespace repeated_stages_test
