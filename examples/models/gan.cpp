// A GAN: two models, two optimizers, and a generator whose output feeds the discriminator both
// detached (the discriminator's step) and attached (the generator's step). The checkpointed run
// cuts the generator into segments with ckpt::checkpoint_sequential and wraps the discriminator's
// layers in place with apply_checkpointing; the discriminator's dropout masks are replayed in the
// recompute. The planned run marks the discriminator's layers as candidates and runs its step
// under a ckpt::PlannedModel, which plans each of the discriminator's two calls (on real samples,
// then on generated ones) apart. Every model stays identical to the plain run's to the bit.

#include <ckpt/ckpt.h>

#include "same_training.h"

#include <optional>

namespace nn = torch::nn;

nn::Sequential make_generator() {
  return nn::Sequential(nn::Linear(16, 32), nn::BatchNorm1d(32), nn::ReLU(), nn::Linear(32, 64),
                        nn::BatchNorm1d(64), nn::ReLU(), nn::Linear(64, 48), nn::Tanh());
}

enum class Run { plain, checkpointed, planned };

nn::Sequential make_discriminator(Run run) {
  nn::Sequential model(nn::Linear(48, 64),
                       nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.2)), nn::Dropout(0.3),
                       nn::Linear(64, 1));
  // The hidden layer and the dropout become regions, or candidates a planner chooses for; names
  // stay "0.weight", "3.bias".
  const auto hidden = [](const std::string& name, const nn::Module&) {
    return name == "0" || name == "2";
  };
  if (run == Run::checkpointed) ckpt::apply_checkpointing(*model, hidden);
  if (run == Run::planned) ckpt::apply_candidates(*model, hidden);
  return model;
}

// The model, moved to `device` (before its optimizer takes its parameters).
nn::Sequential on(nn::Sequential model, const torch::Device& device) {
  model->to(device);
  return model;
}

struct Gan {
  Gan(Run run, const torch::Device& device)
      : generator(on(make_generator(), device)),
        discriminator(on(make_discriminator(run), device)),
        generator_optimizer(generator->parameters(),
                            torch::optim::AdamOptions(2e-4).betas({0.5, 0.999})),
        discriminator_optimizer(discriminator->parameters(),
                                torch::optim::AdamOptions(2e-4).betas({0.5, 0.999})),
        run(run) {
    // The discriminator's step in the least memory any plan needs; the generator's step runs
    // the candidates plainly (no planner at work there).
    if (run == Run::planned) planned_step.emplace(discriminator.ptr(), ckpt::Budget::minimum());
  }

  torch::Tensor generate(const torch::Tensor& noise) {
    return run == Run::checkpointed ? ckpt::checkpoint_sequential(generator, /*segments=*/3, noise)
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
    const auto discriminator_loss = [&] {
      return bce(discriminator->forward(real), 1.0f) +
             bce(discriminator->forward(fake.detach()), 0.0f);
    };
    auto d_loss = planned_step ? planned_step->run(discriminator_loss) : discriminator_loss();
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
  Run run;
  std::optional<ckpt::PlannedModel> planned_step;
};

int main(int argc, char** argv) {
  const torch::Device device = examples::device_from_arguments(argc, argv);
  torch::manual_seed(0);
  Gan plain(Run::plain, device), checkpointed(Run::checkpointed, device),
      planned(Run::planned, device);
  for (Gan* copy : {&checkpointed, &planned}) {
    examples::copy_state(*plain.generator, *copy->generator);
    examples::copy_state(*plain.discriminator, *copy->discriminator);
  }

  bool ok = true;
  for (int step = 0; step < 5; ++step) {
    const auto real = (torch::rand({12, 48}) * 2 - 1).to(device);
    const auto noise = torch::randn({12, 16}).to(device);
    torch::manual_seed(300 + step);
    const auto [plain_d, plain_g] = plain.step(real, noise);
    for (Gan* copy : {&checkpointed, &planned}) {
      torch::manual_seed(300 + step);
      const auto [copy_d, copy_g] = copy->step(real, noise);
      ok &= examples::same("discriminator loss", plain_d, copy_d);
      ok &= examples::same("generator loss", plain_g, copy_g);
      ok &= examples::same_state(*plain.generator, *copy->generator);
      ok &= examples::same_state(*plain.discriminator, *copy->discriminator);
    }
    std::cout << "step " << step << "  D " << plain_d.item<float>() << "  G "
              << plain_g.item<float>() << (ok ? "  identical\n" : "  DIFFERENT\n");
  }
  return ok ? 0 : 1;
}
