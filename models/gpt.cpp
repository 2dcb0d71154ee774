#include "gpt.h"

#include <ckpt/memory_label.h>

#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <stdexcept>

namespace ckpt {
namespace models {

torch::Tensor GptStage::probed(const torch::Tensor& input,
                               const std::function<torch::Tensor(const torch::Tensor&)>& body) {
  const ckpt::MemoryLabel label(name);
  if (probe == nullptr) return body(input);
  probe->on_forward_begin(index);
  torch::Tensor output = body(input);
  probe->on_forward_end(index, output);
  return output;
}

EmbeddingStageImpl::EmbeddingStageImpl(const GptConfig& config) {
  token = register_module("token", torch::nn::Embedding(config.vocab, config.width));
  position = register_module("position", torch::nn::Embedding(config.context, config.width));
  dropout = register_module("dropout", torch::nn::Dropout(config.dropout));
}

torch::Tensor EmbeddingStageImpl::forward(const torch::Tensor& ids) {
  return probed(ids, [this](const torch::Tensor& input) {
    const int64_t length = input.size(1);
    const torch::Tensor positions =
        torch::arange(length, torch::TensorOptions().dtype(torch::kLong).device(input.device()));
    return dropout(token(input) + position(positions));
  });
}

BlockImpl::BlockImpl(const GptConfig& config) : heads_(config.heads) {
  const int64_t c = config.width;
  ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c})));
  qkv = register_module("qkv", torch::nn::Linear(c, 3 * c));
  proj = register_module("proj", torch::nn::Linear(c, c));
  ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c})));
  fc1 = register_module("fc1", torch::nn::Linear(c, 4 * c));
  fc2 = register_module("fc2", torch::nn::Linear(4 * c, c));
  attention_dropout = register_module("attention_dropout", torch::nn::Dropout(config.dropout));
  residual_dropout = register_module("residual_dropout", torch::nn::Dropout(config.dropout));
  causal_mask_ = torch::ones({config.context, config.context}, torch::kBool).triu(1);
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x) {
  return probed(x, [this](const torch::Tensor& input) {
    const int64_t b = input.size(0), t = input.size(1), c = input.size(2);
    const int64_t head_size = c / heads_;
    // Causal multi-head self-attention on the pre-normalised input.
    const torch::Tensor qkv_out = qkv(ln1(input)).view({b, t, 3, heads_, head_size});
    const torch::Tensor q = qkv_out.select(2, 0).transpose(1, 2);  // [B, H, T, D]
    const torch::Tensor k = qkv_out.select(2, 1).transpose(1, 2);
    const torch::Tensor v = qkv_out.select(2, 2).transpose(1, 2);
    torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(double(head_size));
    scores = scores.masked_fill(causal_mask_.slice(0, 0, t).slice(1, 0, t),
                                -std::numeric_limits<float>::infinity());
    const torch::Tensor attention = attention_dropout(torch::softmax(scores, -1));
    const torch::Tensor mixed = torch::matmul(attention, v).transpose(1, 2).reshape({b, t, c});
    const torch::Tensor h = input + residual_dropout(proj(mixed));
    // MLP.
    return h + residual_dropout(fc2(torch::gelu(fc1(ln2(h)))));
  });
}

void BlockImpl::to(torch::Device device, torch::Dtype dtype, bool non_blocking) {
  torch::nn::Module::to(device, dtype, non_blocking);
  causal_mask_ = causal_mask_.to(device);
}

void BlockImpl::to(torch::Device device, bool non_blocking) {
  torch::nn::Module::to(device, non_blocking);
  causal_mask_ = causal_mask_.to(device);
}

HeadStageImpl::HeadStageImpl(const GptConfig& config, torch::Tensor tied_weight)
    : tied_weight_(std::move(tied_weight)) {
  ln = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({config.width})));
  if (!tied_weight_.defined()) {
    head = register_module(
        "head",
        torch::nn::Linear(torch::nn::LinearOptions(config.width, config.vocab).bias(false)));
  }
}

torch::Tensor HeadStageImpl::forward(const torch::Tensor& x) {
  return probed(x, [this](const torch::Tensor& input) {
    const torch::Tensor normalised = ln(input);
    return tied_weight_.defined() ? torch::matmul(normalised, tied_weight_.t()) : head(normalised);
  });
}

torch::nn::Sequential make_gpt(const GptConfig& config) {
  if (config.vocab < 1) throw std::invalid_argument("the corpus has an empty vocabulary");
  if (config.width % config.heads != 0) {
    throw std::invalid_argument("heads (" + std::to_string(config.heads) + ") must divide width (" +
                                std::to_string(config.width) + ")");
  }
  torch::nn::Sequential chain;
  EmbeddingStage embedding(config);
  embedding->index = 0;
  embedding->name = "embedding";
  chain->push_back(embedding);
  for (int64_t i = 0; i < config.layers; ++i) {
    Block block(config);
    block->index = static_cast<int>(i + 1);
    block->name = "block " + std::to_string(i + 1);
    chain->push_back(block);
  }
  HeadStage head(config, config.tied ? embedding->token->weight : torch::Tensor());
  head->index = static_cast<int>(config.layers + 1);
  head->name = "head";
  chain->push_back(head);

  // GPT-2 initialisation: N(0, 0.02) weights, zero biases, residual projections scaled by
  // 1/sqrt(2 * layers); LayerNorm stays at (1, 0).
  torch::NoGradGuard no_grad;
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(config.layers));
  for (const auto& item : chain->named_parameters()) {
    const std::string& name = item.key();
    torch::Tensor parameter = item.value();
    const bool layer_norm = name.find(".ln") != std::string::npos;
    if (layer_norm) continue;
    if (name.size() >= 4 && name.compare(name.size() - 4, 4, "bias") == 0) {
      parameter.zero_();
    } else if (name.find("proj.weight") != std::string::npos ||
               name.find("fc2.weight") != std::string::npos) {
      parameter.normal_(0.0, residual_std);
    } else {
      parameter.normal_(0.0, 0.02);
    }
  }
  return chain;
}

void set_probe(const torch::nn::Sequential& chain, StageProbe* probe) {
  for (const auto& module : chain->children()) {
    if (auto* stage = dynamic_cast<GptStage*>(module.get())) stage->probe = probe;
  }
}

int64_t parameter_count(const torch::nn::Sequential& chain) {
  int64_t count = 0;
  for (const torch::Tensor& parameter : chain->parameters()) count += parameter.numel();
  return count;
}

}  // namespace models
}  // namespace ckpt
