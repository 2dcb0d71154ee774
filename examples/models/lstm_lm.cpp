// An LSTM language model trained with truncated backpropagation through time: the state tuple
// is carried from batch to batch. The checkpointed model runs its LSTM through a Checkpointed
// wrapper (tensor and state in, output and state out) and its dropout and decoder through
// ckpt::checkpoint; dropout masks are replayed in the recompute. It stays identical to the plain
// model to the bit.

#include <ckpt/ckpt.h>

#include "same_training.h"

namespace nn = torch::nn;

using State = std::tuple<torch::Tensor, torch::Tensor>;

struct LanguageModelImpl : nn::Module {
  LanguageModelImpl(int64_t vocabulary, bool checkpointed)
      : embedding(register_module("embedding", nn::Embedding(vocabulary, 16))),
        lstm(register_module("lstm", nn::LSTM(nn::LSTMOptions(16, 32).num_layers(2).dropout(0.2)))),
        dropout(register_module("dropout", nn::Dropout(0.3))),
        decoder(register_module("decoder", nn::Linear(32, vocabulary))),
        checkpointed(checkpointed) {
    // The wrapper shares the LSTM (and its parameters); it is not registered a second time.
    if (checkpointed) checkpointed_lstm = ckpt::Checkpointed(lstm);
  }

  std::tuple<torch::Tensor, State> forward(const torch::Tensor& tokens, const State& state) {
    auto x = embedding(tokens);
    auto [hidden, next] = checkpointed ? checkpointed_lstm(x, state) : lstm(x, state);
    auto head = [this](const torch::Tensor& h) { return decoder(dropout(h)); };
    auto logits = checkpointed ? ckpt::checkpoint(head, hidden) : head(hidden);
    return {logits, next};
  }

  nn::Embedding embedding;
  nn::LSTM lstm;
  nn::Dropout dropout;
  nn::Linear decoder;
  bool checkpointed;
  ckpt::Checkpointed<nn::LSTMImpl> checkpointed_lstm{nullptr};
};
TORCH_MODULE(LanguageModel);

int main(int argc, char** argv) {
  constexpr int64_t kVocabulary = 50, kSequence = 12, kBatch = 4;
  const torch::Device device = examples::device_from_arguments(argc, argv);
  torch::manual_seed(0);
  LanguageModel plain(kVocabulary, false), checkpointed(kVocabulary, true);
  plain->to(device);
  checkpointed->to(device);
  examples::copy_state(*plain, *checkpointed);
  torch::optim::Adam plain_optimizer(plain->parameters(), 1e-2);
  torch::optim::Adam checkpointed_optimizer(checkpointed->parameters(), 1e-2);
  const auto corpus = torch::randint(0, kVocabulary, {6 * kSequence + 1, kBatch}).to(device);

  auto zero_state = [&] {
    return State{torch::zeros({2, kBatch, 32}, device), torch::zeros({2, kBatch, 32}, device)};
  };
  State plain_state = zero_state(), checkpointed_state = zero_state();
  bool ok = true;
  for (int64_t step = 0; step < 6; ++step) {
    const auto inputs = corpus.slice(0, step * kSequence, (step + 1) * kSequence);
    const auto targets = corpus.slice(0, step * kSequence + 1, (step + 1) * kSequence + 1);
    const auto seed = 100 + step;
    auto train = [&](LanguageModel& model, torch::optim::Adam& optimizer, State& state) {
      torch::manual_seed(seed);  // the same dropout masks in both runs
      optimizer.zero_grad();
      auto [logits, next] = model(inputs, state);
      auto loss = torch::nn::functional::cross_entropy(logits.view({-1, kVocabulary}),
                                                       targets.reshape({-1}));
      loss.backward();
      torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
      optimizer.step();
      // Truncated BPTT: the state goes on, its history does not.
      state = State{std::get<0>(next).detach(), std::get<1>(next).detach()};
      return loss.detach();
    };
    const auto plain_loss = train(plain, plain_optimizer, plain_state);
    const auto checkpointed_loss = train(checkpointed, checkpointed_optimizer, checkpointed_state);
    ok &= examples::same("loss", plain_loss, checkpointed_loss);
    ok &= examples::same("state", std::get<1>(plain_state), std::get<1>(checkpointed_state));
    ok &= examples::same_state(*plain, *checkpointed);
    std::cout << "step " << step << "  loss " << plain_loss.item<float>()
              << (ok ? "  identical\n" : "  DIFFERENT\n");
  }
  return ok ? 0 : 1;
}
