// ckpt::PlannedModel on an accelerator (the device suite): the profile measures device memory
// through the caching allocator's statistics and offers offloading; planned steps give the plain
// step's gradients to the bit, dropout included, and stay within the budget and the prediction.

#include <ckpt/ckpt.h>
#include <ckpt/memory_tracker.h>
#include <ckpt/planned_model.h>

#include "device/device_suite.h"

#include <functional>
#include <vector>

namespace {

using ckpt::test::bit_equal;
using ckpt::test::take_grads;

// A block of two candidates (its widening half and its narrowing half), with a residual
// connection outside them and dropout inside.
struct BlockImpl : torch::nn::Module {
  BlockImpl()
      : in(register_module("in", torch::nn::Linear(64, 256))),
        out(register_module("out", torch::nn::Linear(256, 64))),
        dropout(register_module("dropout", torch::nn::Dropout(0.1))) {}
  at::Tensor forward(const at::Tensor& x) {
    auto h = ckpt::candidate(
        *this, "in", [this](const at::Tensor& t) { return torch::gelu(in(t)); }, x);
    return x + ckpt::candidate(
                   *this, "out", [this](const at::Tensor& t) { return dropout(out(t)); }, h);
  }
  torch::nn::Linear in, out;
  torch::nn::Dropout dropout;
};
TORCH_MODULE(Block);

struct TowerImpl : torch::nn::Module {
  TowerImpl() {
    for (int i = 0; i < 4; ++i) blocks->push_back(Block());
    register_module("blocks", blocks);
  }
  at::Tensor forward(at::Tensor x) {
    for (size_t i = 0; i < blocks->size(); ++i) x = blocks->ptr<BlockImpl>(i)->forward(x);
    return x;
  }
  torch::nn::ModuleList blocks;
};
TORCH_MODULE(Tower);

class PlannedModelDeviceTest : public ckpt::test::DeviceTest {
 protected:
  Tower make_tower() const {
    torch::manual_seed(0);
    Tower tower;
    tower->to(device());
    return tower;
  }

  struct Step {
    std::vector<at::Tensor> grads;
    int64_t peak_bytes = 0;
  };

  // One step from no gradients and the same random state, its device peak above the start.
  Step step(Tower& tower, const std::function<at::Tensor()>& loss) const {
    for (auto& p : tower->parameters()) p.mutable_grad().reset();
    seed(1);
    ckpt::MemoryTracker tracker(device());
    const int64_t before = tracker.current_bytes();
    loss().backward();
    return {take_grads(*tower), tracker.peak_bytes() - before};
  }
};

TEST_P(PlannedModelDeviceTest, PlannedStepsGiveThePlainGradientsWithinTheBudget) {
  CKPT_SKIP_IF(missing_rng());
  CKPT_SKIP_IF(missing_memory_statistics());
  const at::Tensor x = torch::randn({128, 64}, on());
  Tower plain_tower = make_tower();
  const Step plain = step(plain_tower, [&] { return plain_tower->forward(x).pow(2).mean(); });
  for (const char* budget : {"min", "70%"}) {
    SCOPED_TRACE(budget);
    Tower tower = make_tower();
    const auto loss = [&] { return tower->forward(x).pow(2).mean(); };
    ckpt::PlannedModel planned(tower, ckpt::Budget::parse(budget));
    planned.plan(loss);
    bool offers_offloading = false;
    for (const auto& c : planned.measured().profile.candidates) {
      for (const auto& option : c.options) offers_offloading |= option.name == "offloaded";
    }
    EXPECT_TRUE(offers_offloading);
    const Step planned_step = step(tower, [&] { return planned.run(loss); });
    ASSERT_EQ(planned_step.grads.size(), plain.grads.size());
    for (size_t i = 0; i < plain.grads.size(); ++i) {
      EXPECT_TRUE(bit_equal(planned_step.grads[i], plain.grads[i])) << "gradient " << i;
    }
    const int64_t predicted = planned.solution().prediction.peak_bytes;
    EXPECT_LE(planned_step.peak_bytes, planned.budget_bytes()) << planned.summary();
    EXPECT_NEAR(static_cast<double>(planned_step.peak_bytes), static_cast<double>(predicted),
                0.02 * static_cast<double>(predicted))
        << planned.summary();
  }
}

CKPT_INSTANTIATE_DEVICE_SUITE(PlannedModelDeviceTest);

}  // namespace
