// A ResNet with BatchNorm, checkpointed the two ways users reach for: a whole layer group through
// ckpt::checkpoint(layer, x) in the forward, and the blocks of another layer group wrapped in place
// by ckpt::apply_checkpointing. Trained side by side with the plain model, the two stay identical
// to the bit, BatchNorm's running statistics and step counters included.

#include <ckpt/ckpt.h>

#include "same_training.h"

namespace nn = torch::nn;

struct BasicBlockImpl : nn::Module {
  BasicBlockImpl(int64_t in, int64_t out, int64_t stride)
      : conv1(register_module(
            "conv1",
            nn::Conv2d(nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false)))),
        bn1(register_module("bn1", nn::BatchNorm2d(out))),
        conv2(register_module("conv2",
                              nn::Conv2d(nn::Conv2dOptions(out, out, 3).padding(1).bias(false)))),
        bn2(register_module("bn2", nn::BatchNorm2d(out))) {
    if (stride != 1 || in != out) {
      shortcut = register_module(
          "shortcut",
          nn::Sequential(nn::Conv2d(nn::Conv2dOptions(in, out, 1).stride(stride).bias(false)),
                         nn::BatchNorm2d(out)));
    }
  }

  torch::Tensor forward(const torch::Tensor& x) {
    auto out = torch::relu(bn1(conv1(x)));
    out = bn2(conv2(out));
    return torch::relu(out + (shortcut.is_empty() ? x : shortcut->forward(x)));
  }

  nn::Conv2d conv1;
  nn::BatchNorm2d bn1;
  nn::Conv2d conv2;
  nn::BatchNorm2d bn2;
  nn::Sequential shortcut{nullptr};
};
TORCH_MODULE(BasicBlock);

struct ResNetImpl : nn::Module {
  explicit ResNetImpl(bool checkpointed) : checkpointed(checkpointed) {
    stem = register_module(
        "stem", nn::Sequential(nn::Conv2d(nn::Conv2dOptions(3, 8, 3).padding(1).bias(false)),
                               nn::BatchNorm2d(8), nn::ReLU()));
    layer1 = register_module("layer1", nn::Sequential(BasicBlock(8, 8, 1), BasicBlock(8, 8, 1)));
    layer2 = register_module("layer2", nn::Sequential(BasicBlock(8, 16, 2), BasicBlock(16, 16, 1)));
    fc = register_module("fc", nn::Linear(16, 10));
    if (checkpointed) {
      // Every block of layer2 becomes a checkpointed region; names stay "layer2.0.conv1.weight".
      ckpt::apply_checkpointing(*this, [](const std::string& name, const nn::Module&) {
        return name == "layer2.0" || name == "layer2.1";
      });
    }
  }

  torch::Tensor forward(torch::Tensor x) {
    x = stem->forward(x);
    // The whole layer group as one region: its BatchNorm statistics still move once per step.
    x = checkpointed ? ckpt::checkpoint(layer1, x) : layer1->forward(x);
    x = layer2->forward(x);
    x = torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
    return fc(x);
  }

  bool checkpointed;
  nn::Sequential stem{nullptr}, layer1{nullptr}, layer2{nullptr};
  nn::Linear fc{nullptr};
};
TORCH_MODULE(ResNet);

int main(int argc, char** argv) {
  const torch::Device device = examples::device_from_arguments(argc, argv);
  torch::manual_seed(0);
  ResNet plain(false), checkpointed(true);
  plain->to(device);
  checkpointed->to(device);
  examples::copy_state(*plain, *checkpointed);
  torch::optim::SGD plain_optimizer(
      plain->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(1e-4));
  torch::optim::SGD checkpointed_optimizer(
      checkpointed->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(1e-4));

  bool ok = true;
  for (int step = 0; step < 4; ++step) {
    const auto images = torch::randn({6, 3, 12, 12}).to(device);
    const auto labels = torch::randint(0, 10, {6}).to(device);
    auto train = [&](ResNet& model, torch::optim::SGD& optimizer) {
      optimizer.zero_grad();
      auto loss = torch::nn::functional::cross_entropy(model(images), labels);
      loss.backward();
      optimizer.step();
      return loss.detach();
    };
    const auto plain_loss = train(plain, plain_optimizer);
    const auto checkpointed_loss = train(checkpointed, checkpointed_optimizer);
    ok &= examples::same("loss", plain_loss, checkpointed_loss);
    ok &= examples::same_state(*plain, *checkpointed);
    std::cout << "step " << step << "  loss " << plain_loss.item<float>()
              << (ok ? "  identical\n" : "  DIFFERENT\n");
  }
  const auto tracked = checkpointed->layer1[0]->as<BasicBlock>()->bn1->num_batches_tracked;
  std::cout << "layer1.0.bn1 counted " << tracked.item<int64_t>() << " batches in 4 steps on "
            << device << "\n";
  return ok && tracked.item<int64_t>() == 4 ? 0 : 1;
}
