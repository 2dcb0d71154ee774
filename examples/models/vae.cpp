// A variational autoencoder whose encoder returns a struct. ckpt sees the struct's tensors through
// a ckpt_tensors function next to it; the sampling step draws its noise inside a checkpointed
// region, and the recompute draws the same noise again. Identical to the plain model to the bit.

#include <ckpt/ckpt.h>

#include "same_training.h"

namespace nn = torch::nn;

struct Encoded {
  torch::Tensor mean;
  torch::Tensor log_variance;
};

// Shows ckpt the tensors of an Encoded (found by argument-dependent lookup).
auto ckpt_tensors(Encoded& encoded) {
  return std::tie(encoded.mean, encoded.log_variance);
}

struct EncoderImpl : nn::Module {
  EncoderImpl()
      : hidden(register_module("hidden", nn::Linear(64, 32))),
        to_mean(register_module("to_mean", nn::Linear(32, 8))),
        to_log_variance(register_module("to_log_variance", nn::Linear(32, 8))) {}
  Encoded forward(const torch::Tensor& x) {
    const auto h = torch::relu(hidden(x));
    return {to_mean(h), to_log_variance(h)};
  }
  nn::Linear hidden, to_mean, to_log_variance;
};
TORCH_MODULE(Encoder);

torch::Tensor sample(const Encoded& encoded) {
  return encoded.mean + torch::randn_like(encoded.mean) * (0.5 * encoded.log_variance).exp();
}

struct VaeImpl : nn::Module {
  explicit VaeImpl(bool checkpointed)
      : encoder(register_module("encoder", Encoder())),
        decoder(register_module("decoder", nn::Sequential(nn::Linear(8, 32), nn::ReLU(),
                                                          nn::Linear(32, 64), nn::Sigmoid()))),
        checkpointed(checkpointed) {}

  std::tuple<torch::Tensor, Encoded> forward(const torch::Tensor& x) {
    const Encoded encoded = checkpointed ? ckpt::checkpoint(encoder, x) : encoder(x);
    const auto z = checkpointed ? ckpt::checkpoint(sample, encoded) : sample(encoded);
    const auto reconstruction = checkpointed ? ckpt::checkpoint(decoder, z) : decoder->forward(z);
    return {reconstruction, encoded};
  }

  Encoder encoder;
  nn::Sequential decoder;
  bool checkpointed;
};
TORCH_MODULE(Vae);

int main(int argc, char** argv) {
  const torch::Device device = examples::device_from_arguments(argc, argv);
  torch::manual_seed(0);
  Vae plain(false), checkpointed(true);
  plain->to(device);
  checkpointed->to(device);
  examples::copy_state(*plain, *checkpointed);
  torch::optim::Adam plain_optimizer(plain->parameters(), 1e-3);
  torch::optim::Adam checkpointed_optimizer(checkpointed->parameters(), 1e-3);

  bool ok = true;
  for (int step = 0; step < 5; ++step) {
    const auto images = torch::rand({16, 64}).to(device);
    const auto seed = 200 + step;
    auto train = [&](Vae& model, torch::optim::Adam& optimizer) {
      torch::manual_seed(seed);  // the same noise in both runs
      optimizer.zero_grad();
      auto [reconstruction, encoded] = model(images);
      auto kl = -0.5 * torch::sum(1 + encoded.log_variance - encoded.mean.pow(2) -
                                  encoded.log_variance.exp());
      auto loss =
          torch::nn::functional::binary_cross_entropy(
              reconstruction, images,
              torch::nn::functional::BinaryCrossEntropyFuncOptions().reduction(torch::kSum)) +
          kl;
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
  return ok ? 0 : 1;
}
