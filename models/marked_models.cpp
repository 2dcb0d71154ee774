#include "marked_models.h"

#include <ckpt/candidate.h>
#include <torch/torch.h>

#include <cmath>
#include <sstream>
#include <vector>

namespace ckpt {
namespace models {

ConvBnReluImpl::ConvBnReluImpl(int64_t in, int64_t out)
    : body_(register_module(
          "body",
          torch::nn::Sequential(
              torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).padding(1).bias(false)),
              torch::nn::BatchNorm2d(out), torch::nn::ReLU()))) {}

at::Tensor ConvBnReluImpl::forward(const at::Tensor& x) {
  return body_->forward(x);
}

DownImpl::DownImpl(int64_t in, int64_t out)
    : conv1_(register_module("conv1", ConvBnRelu(in, out))),
      conv2_(register_module("conv2", ConvBnRelu(out, out))) {}

std::tuple<at::Tensor, at::Tensor> DownImpl::forward(const at::Tensor& x) {
  at::Tensor features = ckpt::candidate(conv2_, ckpt::candidate(conv1_, x));
  return {features, torch::max_pool2d(features, 2)};
}

BottomImpl::BottomImpl(int64_t in, int64_t out)
    : conv1_(register_module("conv1", ConvBnRelu(in, out))),
      conv2_(register_module("conv2", ConvBnRelu(out, out))) {}

at::Tensor BottomImpl::forward(const at::Tensor& x) {
  return ckpt::candidate(conv2_, ckpt::candidate(conv1_, x));
}

UpImpl::UpImpl(int64_t in, int64_t out)
    : up_(register_module("up", torch::nn::ConvTranspose2d(
                                    torch::nn::ConvTranspose2dOptions(in, out, 2).stride(2)))),
      conv1_(register_module("conv1", ConvBnRelu(2 * out, out))),
      conv2_(register_module("conv2", ConvBnRelu(out, out))) {}

at::Tensor UpImpl::forward(const at::Tensor& x, const at::Tensor& skip) {
  // One statement each, so that no temporary outlives its last use (the up-sampled features
  // would live through both convolutions inside one expression).
  at::Tensor h = torch::cat({up_(x), skip}, 1);
  h = ckpt::candidate(conv1_, h);
  return ckpt::candidate(conv2_, h);
}

UNetImpl::UNetImpl(const UNetConfig& c) {
  int64_t channels = c.base, in = c.in_channels;
  for (int64_t level = 0; level < c.levels; ++level, channels *= 2) {
    downs_->push_back(Down(in, channels));
    in = channels;
  }
  bottom_ = Bottom(in, channels);
  for (int64_t level = 0; level < c.levels; ++level) {
    ups_->push_back(Up(channels, channels / 2));
    channels /= 2;
  }
  out_ = torch::nn::Conv2d(torch::nn::Conv2dOptions(channels, c.out_channels, 1));
  register_module("downs", downs_);
  register_module("bottom", bottom_);
  register_module("ups", ups_);
  register_module("out", out_);
}

// Each block is a candidate, marked in one line where the forward calls it: an encoder block
// returns two tensors, a decoder block takes two. The skips stay alive from their encoder block
// to their decoder block, outside every candidate, unless the plan recomputes the encoder block's
// outputs ("recomputed"). (Finer candidates, each convolution, are predicted less exactly: a
// skip's lifetime then depends on more pairs of modes, docs/memory-model.md "Any model".)
at::Tensor UNetImpl::forward(const at::Tensor& x) {
  std::vector<at::Tensor> skips;
  at::Tensor h = x;
  for (size_t i = 0; i < downs_->size(); ++i) {
    auto [skip, pooled] = ckpt::candidate(downs_->ptr<DownImpl>(i), h);
    skips.push_back(skip);
    h = pooled;
  }
  h = ckpt::candidate(bottom_, h);
  for (size_t i = 0; i < ups_->size(); ++i) {
    h = ckpt::candidate(ups_->ptr<UpImpl>(i), h, skips[skips.size() - 1 - i]);
  }
  return out_(h);
}

AttentionImpl::AttentionImpl(int64_t d_model, int64_t heads, bool causal)
    : heads_(heads),
      causal_(causal),
      q_(register_module("q", torch::nn::Linear(d_model, d_model))),
      kv_(register_module("kv", torch::nn::Linear(d_model, 2 * d_model))),
      out_(register_module("out", torch::nn::Linear(d_model, d_model))) {}

at::Tensor AttentionImpl::forward(const at::Tensor& query, const at::Tensor& memory) {
  const int64_t b = query.size(0), t = query.size(1), s = memory.size(1), d = query.size(2);
  const int64_t dh = d / heads_;
  auto q = q_(query).view({b, t, heads_, dh}).transpose(1, 2);
  auto kv = kv_(memory).view({b, s, 2, heads_, dh}).permute({2, 0, 3, 1, 4});
  auto scores = torch::matmul(q, kv[0].transpose(-2, -1)) / std::sqrt(static_cast<double>(dh));
  if (causal_) {
    auto mask = torch::ones({t, s}, query.options().dtype(torch::kBool)).triu(1);
    scores = scores.masked_fill(mask, -std::numeric_limits<float>::infinity());
  }
  auto context =
      torch::matmul(torch::softmax(scores, -1), kv[1]).transpose(1, 2).reshape({b, t, d});
  return out_(context);
}

namespace {
torch::nn::LayerNorm layer_norm(int64_t d) {
  return torch::nn::LayerNorm(torch::nn::LayerNormOptions({d}));
}
}  // namespace

EncoderLayerImpl::EncoderLayerImpl(const Seq2SeqConfig& c)
    : ln1_(register_module("ln1", layer_norm(c.d_model))),
      ln2_(register_module("ln2", layer_norm(c.d_model))),
      attention_(register_module("attention", Attention(c.d_model, c.heads, false))),
      ff1_(register_module("ff1", torch::nn::Linear(c.d_model, c.ff))),
      ff2_(register_module("ff2", torch::nn::Linear(c.ff, c.d_model))) {}

// Its two sublayers are candidates, each marked where it runs.
at::Tensor EncoderLayerImpl::forward(const at::Tensor& x) {
  auto h = ckpt::candidate(
      *this, "attention",
      [this](const at::Tensor& in) {
        auto normed = ln1_(in);
        return in + attention_(normed, normed);
      },
      x);
  return ckpt::candidate(
      *this, "ff", [this](const at::Tensor& in) { return in + ff2_(torch::gelu(ff1_(ln2_(in)))); },
      h);
}

DecoderLayerImpl::DecoderLayerImpl(const Seq2SeqConfig& c)
    : ln1_(register_module("ln1", layer_norm(c.d_model))),
      ln2_(register_module("ln2", layer_norm(c.d_model))),
      ln3_(register_module("ln3", layer_norm(c.d_model))),
      self_(register_module("self", Attention(c.d_model, c.heads, true))),
      cross_(register_module("cross", Attention(c.d_model, c.heads, false))),
      ff1_(register_module("ff1", torch::nn::Linear(c.d_model, c.ff))),
      ff2_(register_module("ff2", torch::nn::Linear(c.ff, c.d_model))) {}

at::Tensor DecoderLayerImpl::forward(const at::Tensor& x, const at::Tensor& memory) {
  auto h = ckpt::candidate(
      *this, "self",
      [this](const at::Tensor& in) {
        auto normed = ln1_(in);
        return in + self_(normed, normed);
      },
      x);
  h = ckpt::candidate(
      *this, "cross",
      [this](const at::Tensor& in, const at::Tensor& mem) { return in + cross_(ln2_(in), mem); }, h,
      memory);
  return ckpt::candidate(
      *this, "ff", [this](const at::Tensor& in) { return in + ff2_(torch::gelu(ff1_(ln3_(in)))); },
      h);
}

Seq2SeqImpl::Seq2SeqImpl(const Seq2SeqConfig& c) {
  for (int64_t i = 0; i < c.encoder_layers; ++i) encoder_->push_back(EncoderLayer(c));
  for (int64_t i = 0; i < c.decoder_layers; ++i) decoder_->push_back(DecoderLayer(c));
  final_ = layer_norm(c.d_model);
  register_module("encoder", encoder_);
  register_module("decoder", decoder_);
  register_module("final", final_);
}

at::Tensor Seq2SeqImpl::forward(const at::Tensor& source, const at::Tensor& target) {
  at::Tensor memory = source;
  for (size_t i = 0; i < encoder_->size(); ++i)
    memory = encoder_->ptr<EncoderLayerImpl>(i)->forward(memory);
  at::Tensor h = target;
  for (size_t i = 0; i < decoder_->size(); ++i)
    h = decoder_->ptr<DecoderLayerImpl>(i)->forward(h, memory);
  return final_(h);
}

UNetConfig unet_config(bool quick) {
  UNetConfig c;  // quick: the defaults
  if (!quick) {
    c.batch = 8;
    c.base = 16;
    c.levels = 4;
    c.image = 128;
  }
  return c;
}

Seq2SeqConfig seq2seq_config(bool quick) {
  Seq2SeqConfig c;  // quick: the defaults
  if (!quick) {
    c.batch = 4;
    c.source = 256;
    c.target = 192;
    c.d_model = 128;
    c.ff = 512;
    c.encoder_layers = 4;
    c.decoder_layers = 4;
  }
  return c;
}

std::string describe(const UNetConfig& c) {
  std::ostringstream d;
  d << "U-Net, " << c.levels << " levels from " << c.base << " channels, BatchNorm; input "
    << c.batch << "x" << c.in_channels << "x" << c.image << "x" << c.image;
  return d.str();
}

std::string describe(const Seq2SeqConfig& c) {
  std::ostringstream d;
  d << "encoder-decoder transformer, " << c.encoder_layers << "+" << c.decoder_layers
    << " pre-LN layers, d=" << c.d_model << ", " << c.heads << " heads, FF " << c.ff
    << ", cross-attention; source " << c.batch << "x" << c.source << ", target " << c.batch << "x"
    << c.target;
  return d.str();
}

UNet make_unet(const UNetConfig& config) {
  torch::manual_seed(0);
  return UNet(config);
}

at::Tensor unet_input(const UNetConfig& c) {
  torch::manual_seed(1);
  return torch::randn({c.batch, c.in_channels, c.image, c.image});
}

Seq2Seq make_seq2seq(const Seq2SeqConfig& config) {
  torch::manual_seed(0);
  return Seq2Seq(config);
}

std::tuple<at::Tensor, at::Tensor> seq2seq_inputs(const Seq2SeqConfig& c) {
  torch::manual_seed(1);
  at::Tensor source = torch::randn({c.batch, c.source, c.d_model});
  return {source, torch::randn({c.batch, c.target, c.d_model})};
}

}  // namespace models
}  // namespace ckpt
