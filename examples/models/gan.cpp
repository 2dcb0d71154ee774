// A GAN: two models, two optimizers, and a generator whose output feeds the discriminator both
// detached (the discriminator's step) and attached (the generator's step). The checkpointed run
// cuts the generator into segments with ckpt::checkpoint_sequential and wraps the discriminator's
// layers in place with apply_checkpointing; the discriminator's dropout masks are replayed in the
// recompute. Both models stay identical to the plain run to the bit.

#include <ckpt/ckpt.h>

#include "same_training.h"

namespace nn = torch::nn;

nn::Sequential make_generator() {
  return nn::Sequential(nn::Linear(16, 32), nn::BatchNorm1d(32), nn::ReLU(), nn::Linear(32, 64),
                        nn::BatchNorm1d(64), nn::ReLU(), nn::Linear(64, 48), nn::Tanh());
}

nn::Sequential make_discriminator(bool checkpointed) {
  nn::Sequential model(nn::Linear(48, 64),
                       nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.2)), nn::Dropout(0.3),
                       nn::Linear(64, 1));
  if (checkpointed) {
    // The hidden layer and the dropout become regions; names stay "0.weight", "3.bias".
    ckpt::apply_checkpointing(*model, [](const std::string& name, const nn::Module&) {
      return name == "0" || name == "2";
    });
  }
  return model;
}

// The model, moved to `device` (before its optimizer takes its parameters).
nn::Sequential on(nn::Sequential model, const torch::Device& device) {
  model->to(device);
  return model;
}

struct Gan {
  Gan(bool checkpointed, const torch::Device& device)
      : generator(on(make_generator(), device)),
        discriminator(on(make_discriminator(checkpointed), device)),
        generator_optimizer(generator->parameters(),
                            torch::optim::AdamOptions(2e-4).betas({0.5, 0.999})),
        discriminator_optimizer(discriminator->parameters(),
                                torch::optim::AdamOptions(2e-4).betas({0.5, 0.999})),
        checkpointed(checkpointed) {}

  torch::Tensor generate(const torch::Tensor& noise) {
    return checkpointed ? ckpt::checkpoint_sequential(generator, /*segments=*/3, noise)
                        : generator->forward(noise);
  }

  // One step of each model; returns both losses.
  std::pair<torch::Tensor, torch::Tensor> step(const torch::Tensor& real,
                                               const torch::Tensor& noise) {
    auto bce = [](const torch::Tensor& logits, float target) {
      return torch::nn::functional::binary_cross_entropy_with_logits(
          logits, torch::full_like(logits, target));
    };
    discriminator_optimizer.zero_grad();
    const auto fake = generate(noise);
    auto d_loss =
        bce(discriminator->forward(real), 1.0f) + bce(discriminator->forward(fake.detach()), 0.0f);
    d_loss.backward();
    discriminator_optimizer.step();

    generator_optimizer.zero_grad();
    auto g_loss = bce(discriminator->forward(fake), 1.0f);
    g_loss.backward();
    generator_optimizer.step();
    return {d_loss.detach(), g_loss.detach()};
  }

  nn::Sequential generator, discriminator;
  torch::optim::Adam generator_optimizer, discriminator_optimizer;
  bool checkpointed;
};

int main(int argc, char** argv) {
  const torch::Device device = examples::device_from_arguments(argc, argv);
  torch::manual_seed(0);
  Gan plain(false, device), checkpointed(true, device);
  examples::copy_state(*plain.generator, *checkpointed.generator);
  examples::copy_state(*plain.discriminator, *checkpointed.discriminator);

  bool ok = true;
  for (int step = 0; step < 5; ++step) {
    const auto real = (torch::rand({12, 48}) * 2 - 1).to(device);
    const auto noise = torch::randn({12, 16}).to(device);
    torch::manual_seed(300 + step);
    const auto [plain_d, plain_g] = plain.step(real, noise);
    torch::manual_seed(300 + step);
    const auto [checkpointed_d, checkpointed_g] = checkpointed.step(real, noise);
    ok &= examples::same("discriminator loss", plain_d, checkpointed_d);
    ok &= examples::same("generator loss", plain_g, checkpointed_g);
    ok &= examples::same_state(*plain.generator, *checkpointed.generator);
    ok &= examples::same_state(*plain.discriminator, *checkpointed.discriminator);
    std::cout << "step " << step << "  D " << plain_d.item<float>() << "  G "
              << plain_g.item<float>() << (ok ? "  identical\n" : "  DIFFERENT\n");
  }
  return ok ? 0 : 1;
}
