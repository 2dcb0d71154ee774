#pragma once

// The built-in model of `ckpt train`: a GPT-style character-level transformer language model,
// built as a chain of stages (a torch::nn::Sequential whose stages take and return one tensor)
// so that checkpoint_sequential and PlannedSequential apply to it directly:
//   stage 0        token ids [B, T] -> token + position embeddings, dropout -> [B, T, C]
//   stages 1..N    pre-LN transformer blocks (causal multi-head attention, GELU MLP)
//   stage N+1      final LayerNorm and the head -> logits [B, T, vocab]
// The loss (cross-entropy) is computed outside the chain.

#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace ckpt {
namespace models {

struct GptConfig {
  int64_t vocab = 0;
  int64_t layers = 6;
  int64_t width = 128;
  int64_t heads = 4;
  int64_t context = 128;
  double dropout = 0.1;
  /// Head weight shared with the token embedding.
  bool tied = true;
};

/// Told when a stage's forward starts and ends (traces); may register hooks on the output.
struct StageProbe {
  virtual ~StageProbe() = default;
  virtual void on_forward_begin(int stage) = 0;
  virtual void on_forward_end(int stage, const torch::Tensor& output) = 0;
};

/// Common part of the stages: an index in the chain, a name ("embedding", "block 1", ...,
/// "head": its forward's memory label, see ckpt::MemoryLabel) and an optional probe.
class GptStage : public torch::nn::Module {
 public:
  int index = 0;
  std::string name;
  StageProbe* probe = nullptr;

 protected:
  torch::Tensor probed(const torch::Tensor& input,
                       const std::function<torch::Tensor(const torch::Tensor&)>& body);
};

class EmbeddingStageImpl : public GptStage {
 public:
  explicit EmbeddingStageImpl(const GptConfig& config);
  torch::Tensor forward(const torch::Tensor& ids);
  torch::nn::Embedding token{nullptr}, position{nullptr};
  torch::nn::Dropout dropout{nullptr};
};
TORCH_MODULE(EmbeddingStage);

class BlockImpl : public GptStage {
 public:
  explicit BlockImpl(const GptConfig& config);
  torch::Tensor forward(const torch::Tensor& x);
  // The causal mask moves with the module. It is no buffer: regions copy every buffer of the
  // modules they run, as state that a forward may change.
  using torch::nn::Module::to;
  void to(torch::Device device, torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Device device, bool non_blocking = false) override;
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  torch::nn::Linear qkv{nullptr}, proj{nullptr}, fc1{nullptr}, fc2{nullptr};
  torch::nn::Dropout attention_dropout{nullptr}, residual_dropout{nullptr};

 private:
  int64_t heads_;
  torch::Tensor causal_mask_;  // [context, context], true above the diagonal (not a buffer)
};
TORCH_MODULE(Block);

class HeadStageImpl : public GptStage {
 public:
  /// `tied_weight`: the token embedding's weight to reuse, or an undefined tensor for an own
  /// Linear head.
  HeadStageImpl(const GptConfig& config, torch::Tensor tied_weight);
  torch::Tensor forward(const torch::Tensor& x);
  torch::nn::LayerNorm ln{nullptr};
  torch::nn::Linear head{nullptr};

 private:
  torch::Tensor tied_weight_;  // not registered: it is stage 0's parameter
};
TORCH_MODULE(HeadStage);

/// Builds the chain (layers + 2 stages) with GPT-2 style initialisation from the current torch
/// seed. Throws std::invalid_argument for invalid sizes.
torch::nn::Sequential make_gpt(const GptConfig& config);

/// Sets the probe of every stage of a chain built by `make_gpt` (nullptr to remove).
void set_probe(const torch::nn::Sequential& chain, StageProbe* probe);

/// Number of parameters (the tied weight counted once).
int64_t parameter_count(const torch::nn::Sequential& chain);

}  // namespace models
}  // namespace ckpt
