// Issue 33, item 1, measured: the operators the recomputes of the bench transformer run per step,
// each of its stages a region (checkpoint_sequential), with early stop off and on.

#include "bench_models.h"

#include "autograd/dispatch_mode.h"
#include "support/support.h"

#include <ckpt/ckpt.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <iostream>
#include <memory>
#include <vector>

namespace early_stop_transformer_test {

using ckpt::test::bit_equal;
using ckpt::test::take_grads;

// Counts the operator calls that reach the kernels while a recompute runs: held as the
// recompute's context (outside early stop's mode, so skipped calls do not reach it).
class KernelCount : public ckpt::detail::DispatchMode {
 public:
  explicit KernelCount(int64_t& count) : count_(count) {}
  void dispatch(const c10::OperatorHandle& op, torch::jit::Stack* stack) override {
    ++count_;
    run(op, stack);
  }

 private:
  int64_t& count_;
};

struct Counting {
  explicit Counting(int64_t& count) : mode(count), guard(mode) {}
  KernelCount mode;
  ckpt::detail::DispatchModeGuard guard;
};

TEST(EarlyStopOnTheBenchTransformer, RecomputesFewerOperatorsWithTheSameGradients) {
  const auto config = ckpt::models::model_config("transformer", /*quick=*/false);
  torch::nn::Sequential model = ckpt::models::build_model(config);
  const at::Tensor input = ckpt::models::make_input(config);
  const int64_t stages = static_cast<int64_t>(model->size());
  int64_t count = 0;
  const auto counted = ckpt::CheckpointOptions().context_fn([&count] {
    return ckpt::RegionContexts{nullptr, [&count] { return std::make_shared<Counting>(count); }};
  });
  auto step = [&](bool checkpointed, const ckpt::CheckpointOptions& options) {
    count = 0;
    const at::Tensor out = checkpointed ? ckpt::checkpoint_sequential(model, stages, input, options)
                                        : model->forward(input);
    out.pow(2).mean().backward();
    return take_grads(*model);
  };
  const auto plain = step(false, counted);
  std::vector<int64_t> counts;
  for (const bool early_stop : {false, true}) {
    for (int run = 0; run < 2; ++run) {
      const auto grads = step(true, ckpt::CheckpointOptions(counted).early_stop(early_stop));
      counts.push_back(count);
      for (size_t i = 0; i < grads.size(); ++i) EXPECT_TRUE(bit_equal(grads[i], plain[i])) << i;
    }
  }
  std::cout << "operators recomputed per step (" << stages << " regions): early stop off "
            << counts[0] << ", " << counts[1] << "; on " << counts[2] << " (learning), "
            << counts[3] << "\n";
  EXPECT_EQ(counts[0], counts[1]);
  EXPECT_EQ(counts[2], counts[0]);  // the first recompute at each call site runs in full
  EXPECT_LT(counts[3], counts[0]);
}

}  // namespace early_stop_transformer_test
