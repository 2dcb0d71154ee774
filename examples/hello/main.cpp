// The smallest ckpt program: checkpoint a block of layers and train it for a few steps.
// The first lines of the README's example, as a program that trains.

#include <ckpt/ckpt.h>
#include <torch/torch.h>

#include <iostream>

int main() {
  torch::manual_seed(0);
  torch::nn::Sequential block(torch::nn::Linear(64, 256), torch::nn::GELU(),
                              torch::nn::Dropout(0.1), torch::nn::Linear(256, 64));
  torch::nn::Linear head(64, 1);
  torch::optim::SGD optimizer(block->parameters(), /*lr=*/0.01);

  for (int step = 0; step < 5; ++step) {
    auto x = torch::randn({32, 64});
    // The block keeps no activations; backward recomputes them, dropout masks included.
    auto h = ckpt::checkpoint(block, x);
    auto loss = head(h).pow(2).mean();
    optimizer.zero_grad();
    loss.backward();
    optimizer.step();
    std::cout << "step " << step << " loss " << loss.item<float>() << "\n";
  }
}
