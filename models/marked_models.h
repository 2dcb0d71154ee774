#pragma once

// Models that are not chains, whose own forward marks the blocks the planner may choose for
// (ckpt::candidate): a U-Net with skip connections across half the model, and an encoder-decoder
// transformer with cross-attention. `ckpt::PlannedModel` plans them; run without one, they are
// plain models.

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <string>
#include <tuple>

namespace ckpt {
namespace models {

/// A U-Net: `levels` encoder blocks (two 3x3 conv + BatchNorm + ReLU, channels doubling from
/// `base`), each keeping its features for the decoder and halving the resolution; a bottom block;
/// `levels` decoder blocks (a 2x2 transposed conv up, concatenated with the encoder's features,
/// then two conv + BatchNorm + ReLU); a 1x1 conv to `out_channels`. Its forward marks each block
/// as a candidate, one line each.
/// The defaults are the quick configuration of the tests: small, but with activations that outweigh
/// the parameters' gradients, as in full-size U-Nets.
struct UNetConfig {
  int64_t batch = 2;
  int64_t in_channels = 3;
  int64_t out_channels = 2;
  int64_t base = 4;
  int64_t levels = 3;
  int64_t image = 64;  // the input is batch x in_channels x image x image
};

/// conv3x3 + BatchNorm + ReLU.
class ConvBnReluImpl : public torch::nn::Module {
 public:
  ConvBnReluImpl(int64_t in, int64_t out);
  at::Tensor forward(const at::Tensor& x);

 private:
  torch::nn::Sequential body_{nullptr};
};
TORCH_MODULE(ConvBnRelu);

/// An encoder block: two ConvBnRelu; returns its features (the skip) and their 2x2 max-pool.
class DownImpl : public torch::nn::Module {
 public:
  DownImpl(int64_t in, int64_t out);
  std::tuple<at::Tensor, at::Tensor> forward(const at::Tensor& x);

 private:
  ConvBnRelu conv1_{nullptr}, conv2_{nullptr};
};
TORCH_MODULE(Down);

/// The bottom block: two ConvBnRelu.
class BottomImpl : public torch::nn::Module {
 public:
  BottomImpl(int64_t in, int64_t out);
  at::Tensor forward(const at::Tensor& x);

 private:
  ConvBnRelu conv1_{nullptr}, conv2_{nullptr};
};
TORCH_MODULE(Bottom);

/// A decoder block: up-samples `x` (2x2 transposed conv), concatenates the encoder's `skip`, and
/// convolves twice.
class UpImpl : public torch::nn::Module {
 public:
  UpImpl(int64_t in, int64_t out);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& skip);

 private:
  torch::nn::ConvTranspose2d up_{nullptr};
  ConvBnRelu conv1_{nullptr}, conv2_{nullptr};
};
TORCH_MODULE(Up);

class UNetImpl : public torch::nn::Module {
 public:
  explicit UNetImpl(const UNetConfig& config);
  at::Tensor forward(const at::Tensor& x);

 private:
  torch::nn::ModuleList downs_, ups_;
  Bottom bottom_{nullptr};
  torch::nn::Conv2d out_{nullptr};
};
TORCH_MODULE(UNet);

/// An encoder-decoder transformer on embedded sequences (pre-LayerNorm, explicit multi-head
/// attention, GELU feed-forward): `encoder_layers` of self-attention, `decoder_layers` of causal
/// self-attention, cross-attention to the encoder's output, and feed-forward. Every sublayer is a
/// candidate. The defaults are the quick configuration (attention scores outweigh the parameters'
/// gradients).
struct Seq2SeqConfig {
  int64_t batch = 2;
  int64_t source = 48;  // source sequence length
  int64_t target = 40;  // target sequence length
  int64_t d_model = 32;
  int64_t heads = 4;
  int64_t ff = 128;
  int64_t encoder_layers = 2;
  int64_t decoder_layers = 2;
};

/// Multi-head attention of `query` over `memory` (itself for self-attention).
class AttentionImpl : public torch::nn::Module {
 public:
  AttentionImpl(int64_t d_model, int64_t heads, bool causal);
  at::Tensor forward(const at::Tensor& query, const at::Tensor& memory);

 private:
  int64_t heads_;
  bool causal_;
  torch::nn::Linear q_{nullptr}, kv_{nullptr}, out_{nullptr};
};
TORCH_MODULE(Attention);

class EncoderLayerImpl : public torch::nn::Module {
 public:
  EncoderLayerImpl(const Seq2SeqConfig& config);
  at::Tensor forward(const at::Tensor& x);

 private:
  torch::nn::LayerNorm ln1_{nullptr}, ln2_{nullptr};
  Attention attention_{nullptr};
  torch::nn::Linear ff1_{nullptr}, ff2_{nullptr};
};
TORCH_MODULE(EncoderLayer);

class DecoderLayerImpl : public torch::nn::Module {
 public:
  DecoderLayerImpl(const Seq2SeqConfig& config);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& memory);

 private:
  torch::nn::LayerNorm ln1_{nullptr}, ln2_{nullptr}, ln3_{nullptr};
  Attention self_{nullptr}, cross_{nullptr};
  torch::nn::Linear ff1_{nullptr}, ff2_{nullptr};
};
TORCH_MODULE(DecoderLayer);

class Seq2SeqImpl : public torch::nn::Module {
 public:
  explicit Seq2SeqImpl(const Seq2SeqConfig& config);
  /// source: batch x source x d_model, target: batch x target x d_model (embedded).
  at::Tensor forward(const at::Tensor& source, const at::Tensor& target);

 private:
  torch::nn::ModuleList encoder_, decoder_;
  torch::nn::LayerNorm final_{nullptr};
};
TORCH_MODULE(Seq2Seq);

/// The configurations `ckpt train` and `ckpt bench` use: full size, or quick (tiny, for tests).
UNetConfig unet_config(bool quick);
Seq2SeqConfig seq2seq_config(bool quick);
std::string describe(const UNetConfig& config);
std::string describe(const Seq2SeqConfig& config);

/// Deterministic models (seeded) and inputs (not requiring grad).
UNet make_unet(const UNetConfig& config);
at::Tensor unet_input(const UNetConfig& config);
Seq2Seq make_seq2seq(const Seq2SeqConfig& config);
std::tuple<at::Tensor, at::Tensor> seq2seq_inputs(const Seq2SeqConfig& config);

}  // namespace models
}  // namespace ckpt
