// Trains the same small model twice, with and without checkpointing, from the same seed, and
// prints the peak memory of a step (above what lives between steps) for each and whether every
// gradient was identical at every step.

#include <ckpt/ckpt.h>
#include <torch/torch.h>

#include <cstdio>

namespace {

struct Run {
  int64_t peak_bytes = 0;
  std::vector<std::vector<torch::Tensor>> grads;  // per step, per parameter
  std::vector<float> losses;
};

Run train(bool checkpointed, int steps) {
  torch::manual_seed(0);
  const int64_t width = 512, depth = 8;
  std::vector<torch::nn::Sequential> blocks;
  std::vector<torch::Tensor> params;
  for (int64_t i = 0; i < depth; ++i) {
    blocks.emplace_back(torch::nn::Linear(width, width), torch::nn::GELU(), torch::nn::Dropout(0.1),
                        torch::nn::Linear(width, width), torch::nn::Tanh());
    for (auto& p : blocks.back()->parameters()) params.push_back(p);
  }
  torch::optim::SGD optimizer(params, /*lr=*/0.05);
  // Gradient buffers exist before the first step (zero_grad() keeps them), so the peak measures
  // the activations and temporaries of a step, which is what checkpointing changes.
  for (auto& p : params) p.mutable_grad() = torch::zeros_like(p);
  ckpt::MemoryTracker tracker;
  Run run;
  for (int step = 0; step < steps; ++step) {
    auto x = torch::randn({256, width});
    optimizer.zero_grad();
    tracker.reset_peak();
    const int64_t before = tracker.current_bytes();
    auto h = x;
    for (auto& block : blocks) h = checkpointed ? ckpt::checkpoint(block, h) : block->forward(h);
    auto loss = h.pow(2).mean();
    loss.backward();
    run.peak_bytes = std::max(run.peak_bytes, tracker.peak_bytes() - before);
    run.losses.push_back(loss.item<float>());
    run.grads.emplace_back();
    for (auto& p : params) run.grads.back().push_back(p.grad().clone());
    optimizer.step();
  }
  return run;
}

}  // namespace

int main() {
  torch::set_num_threads(1);
  const int steps = 5;
  const Run plain = train(false, steps);
  const Run checkpointed = train(true, steps);
  bool identical = true;
  for (int s = 0; s < steps; ++s) {
    for (size_t i = 0; i < plain.grads[s].size(); ++i) {
      identical = identical && torch::equal(plain.grads[s][i], checkpointed.grads[s][i]);
    }
  }
  std::printf("8 blocks of Linear(512)-GELU-Dropout-Linear(512)-Tanh, batch 256, %d SGD steps\n",
              steps);
  std::printf("%-22s %12s %12s\n", "", "step peak MiB", "last loss");
  std::printf("%-22s %12.2f %12.6f\n", "no checkpointing", plain.peak_bytes / 1048576.0,
              plain.losses.back());
  std::printf("%-22s %12.2f %12.6f\n", "ckpt::checkpoint", checkpointed.peak_bytes / 1048576.0,
              checkpointed.losses.back());
  std::printf("peak memory ratio: %.2f\n",
              static_cast<double>(checkpointed.peak_bytes) / plain.peak_bytes);
  std::printf("gradients identical at every step: %s\n", identical ? "yes" : "NO");
  return identical ? 0 : 1;
}
