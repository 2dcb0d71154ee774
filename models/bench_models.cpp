#include "bench_models.h"

#include <ckpt/candidate.h>
#include <ckpt/modules.h>
#include <ckpt/sequential.h>
#include <torch/torch.h>

#include <cmath>
#include <sstream>
#include <stdexcept>

namespace ckpt {
namespace models {
namespace {

// One MLP stage: tanh(linear(x)).
class MlpLayerImpl : public torch::nn::Module {
 public:
  MlpLayerImpl(int64_t width, bool gelu)
      : linear_(register_module("linear", torch::nn::Linear(width, width))), gelu_(gelu) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return gelu_ ? torch::gelu(linear_(x)) : torch::tanh(linear_(x));
  }

 private:
  torch::nn::Linear linear_;
  bool gelu_;
};
TORCH_MODULE(MlpLayer);

// The ResNet stem: relu(bn(conv3x3(x))).
class StemImpl : public torch::nn::Module {
 public:
  StemImpl(int64_t channels, bool batch_norm)
      : conv_(register_module(
            "conv",
            torch::nn::Conv2d(torch::nn::Conv2dOptions(3, channels, 3).padding(1).bias(false)))) {
    if (batch_norm) bn_ = register_module("bn", torch::nn::BatchNorm2d(channels));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return ckpt::candidate(
        *this, "conv",
        [this](const torch::Tensor& in) {
          auto h = conv_(in);
          return torch::relu(bn_ ? bn_(h) : h);
        },
        x);
  }

 private:
  torch::nn::Conv2d conv_;
  torch::nn::BatchNorm2d bn_{nullptr};
};
TORCH_MODULE(Stem);

// A basic residual block: relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)); the shortcut is
// a strided 1x1 conv + BatchNorm when the block changes the shape.
class ResidualBlockImpl : public torch::nn::Module {
 public:
  ResidualBlockImpl(int64_t in, int64_t out, int64_t stride, bool batch_norm)
      : conv1_(register_module(
            "conv1",
            torch::nn::Conv2d(
                torch::nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false)))),
        conv2_(register_module(
            "conv2",
            torch::nn::Conv2d(torch::nn::Conv2dOptions(out, out, 3).padding(1).bias(false)))) {
    if (batch_norm) {
      bn1_ = register_module("bn1", torch::nn::BatchNorm2d(out));
      bn2_ = register_module("bn2", torch::nn::BatchNorm2d(out));
    }
    if (stride != 1 || in != out) {
      proj_ = register_module(
          "proj",
          torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 1).stride(stride).bias(false)));
      if (batch_norm) proj_bn_ = register_module("proj_bn", torch::nn::BatchNorm2d(out));
    }
  }
  // Two candidates inside the block, one per convolution, so that a planner of any model
  // (ckpt::PlannedModel) can cut the block where a chain can't; without one they simply run.
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = ckpt::candidate(
        *this, "conv1",
        [this](const torch::Tensor& in) {
          auto y = conv1_(in);
          return torch::relu(bn1_ ? bn1_(y) : y);
        },
        x);
    return ckpt::candidate(
        *this, "conv2",
        [this](const torch::Tensor& in, const torch::Tensor& block_input) {
          auto y = conv2_(in);
          if (bn2_) y = bn2_(y);
          torch::Tensor shortcut = block_input;
          if (proj_) {
            shortcut = proj_(block_input);
            if (proj_bn_) shortcut = proj_bn_(shortcut);
          }
          return torch::relu(y + shortcut);
        },
        h, x);
  }

 private:
  torch::nn::Conv2d conv1_;
  torch::nn::BatchNorm2d bn1_{nullptr};
  torch::nn::Conv2d conv2_;
  torch::nn::BatchNorm2d bn2_{nullptr};
  torch::nn::Conv2d proj_{nullptr};
  torch::nn::BatchNorm2d proj_bn_{nullptr};
};
TORCH_MODULE(ResidualBlock);

// The ResNet head: linear(mean over H, W).
class HeadImpl : public torch::nn::Module {
 public:
  explicit HeadImpl(int64_t channels)
      : linear_(register_module("linear", torch::nn::Linear(channels, 10))) {}
  torch::Tensor forward(const torch::Tensor& x) { return linear_(x.mean({2, 3})); }

 private:
  torch::nn::Linear linear_;
};
TORCH_MODULE(Head);

// The attention half of a pre-LayerNorm transformer block, x + out(attention(ln1(x))), with
// explicit multi-head attention (the same ops as the Python twin, rather than
// nn::MultiheadAttention, whose C++ and Python paths differ). The residual stream is the one
// tensor between the two halves, so a block is a chain of two stages.
class AttentionHalfImpl : public torch::nn::Module {
 public:
  AttentionHalfImpl(int64_t d_model, int64_t heads)
      : heads_(heads),
        ln1_(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d_model})))),
        qkv_(register_module("qkv", torch::nn::Linear(d_model, 3 * d_model))),
        out_(register_module("out", torch::nn::Linear(d_model, d_model))) {}
  // A candidate for a planner of any model (ckpt::PlannedModel); without one it simply runs.
  torch::Tensor forward(const torch::Tensor& x) {
    return ckpt::candidate(
        *this, "attention", [this](const torch::Tensor& in) { return body(in); }, x);
  }

 private:
  torch::Tensor body(const torch::Tensor& x) {
    const int64_t b = x.size(0), s = x.size(1), d = x.size(2), dh = d / heads_;
    auto qkv = qkv_(ln1_(x)).view({b, s, 3, heads_, dh}).permute({2, 0, 3, 1, 4});
    auto q = qkv[0], k = qkv[1], v = qkv[2];
    auto scores =
        torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(dh)));
    auto context = torch::matmul(torch::softmax(scores, -1), v).transpose(1, 2).reshape({b, s, d});
    return x + out_(context);
  }

  int64_t heads_;
  torch::nn::LayerNorm ln1_;
  torch::nn::Linear qkv_, out_;
};
TORCH_MODULE(AttentionHalf);

// The MLP half of the block: x + ff2(gelu(ff1(ln2(x)))).
class FeedForwardHalfImpl : public torch::nn::Module {
 public:
  FeedForwardHalfImpl(int64_t d_model, int64_t ff)
      : ln2_(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d_model})))),
        ff1_(register_module("ff1", torch::nn::Linear(d_model, ff))),
        ff2_(register_module("ff2", torch::nn::Linear(ff, d_model))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return ckpt::candidate(
        *this, "mlp",
        [this](const torch::Tensor& in) { return in + ff2_(torch::gelu(ff1_(ln2_(in)))); }, x);
  }

 private:
  torch::nn::LayerNorm ln2_;
  torch::nn::Linear ff1_, ff2_;
};
TORCH_MODULE(FeedForwardHalf);

// A transformer block as the chain of its halves.
torch::nn::Sequential transformer_block(int64_t d_model, int64_t heads, int64_t ff) {
  return torch::nn::Sequential(AttentionHalf(d_model, heads), FeedForwardHalf(d_model, ff));
}

}  // namespace

std::vector<std::string> model_names() {
  return {"mlp", "resnet", "transformer", "small"};
}

std::string describe(const ModelConfig& c) {
  std::ostringstream d;
  if (c.kind == "mlp") {
    d << c.depth << " x (Linear(" << c.width << ", " << c.width << ") + "
      << (c.activation == "gelu" ? "GELU" : "Tanh") << "), batch " << c.batch;
  } else if (c.kind == "resnet") {
    d << "stem conv 3->" << c.channels.front() << ", " << c.channels.size() << " stages x "
      << c.blocks_per_stage << " residual blocks, channels";
    for (size_t i = 0; i < c.channels.size(); ++i) d << (i ? "->" : " ") << c.channels[i];
    d << (c.batch_norm ? ", BatchNorm" : ", no BatchNorm")
      << " (resolution halves per stage), head; input " << c.batch << "x3x" << c.image << "x"
      << c.image;
  } else {
    d << c.depth << " pre-LN blocks (" << 2 * c.depth
      << " stages: attention and MLP halves), d=" << c.d_model << ", " << c.heads << " heads, FF "
      << c.ff << ", GELU; input " << c.batch << "x" << c.seq << "x" << c.d_model;
  }
  return d.str();
}

ModelConfig model_config(const std::string& name, bool quick) {
  ModelConfig c;
  c.name = name;
  if (name == "mlp") {
    c.kind = "mlp";
    c.depth = quick ? 16 : 64;
    c.width = quick ? 32 : 256;
    c.batch = quick ? 8 : 128;
  } else if (name == "small") {
    c.kind = "mlp";
    c.depth = quick ? 32 : 128;
    c.width = quick ? 8 : 32;
    c.batch = quick ? 4 : 16;
  } else if (name == "small_gelu") {  // the layer of issue 9's instruction count
    c.kind = "mlp";
    c.depth = quick ? 16 : 64;
    c.width = quick ? 8 : 32;
    c.batch = quick ? 4 : 8;
    c.activation = "gelu";
  } else if (name == "resnet") {
    c.kind = "resnet";
    c.channels = quick ? std::vector<int64_t>{4, 8} : std::vector<int64_t>{16, 32, 64, 128};
    c.blocks_per_stage = quick ? 1 : 4;
    c.image = quick ? 16 : 64;
    c.batch = quick ? 2 : 8;
  } else if (name == "transformer") {
    c.kind = "transformer";
    c.depth = quick ? 2 : 8;
    c.d_model = quick ? 16 : 128;
    c.heads = 4;
    c.ff = 4 * c.d_model;
    c.seq = quick ? 8 : 256;
    c.batch = quick ? 2 : 4;
  } else {
    throw std::invalid_argument("ckpt bench: unknown model '" + name +
                                "' (expected mlp, resnet, transformer, small or small_gelu)");
  }
  c.description = describe(c);
  return c;
}

torch::nn::Sequential build_model(const ModelConfig& c) {
  torch::manual_seed(0);
  torch::nn::Sequential model;
  if (c.kind == "mlp") {
    for (int64_t i = 0; i < c.depth; ++i)
      model->push_back(MlpLayer(c.width, c.activation == "gelu"));
  } else if (c.kind == "resnet") {
    // The stem, each resolution stage as the chain of its blocks, and the head: one chain of
    // blocks (a block's interior carries two tensors, its input and its branch, so the chain
    // cannot be cut inside it).
    std::vector<torch::nn::Sequential> parts{
        torch::nn::Sequential(Stem(c.channels.front(), c.batch_norm))};
    int64_t in = c.channels.front();
    for (size_t s = 0; s < c.channels.size(); ++s) {
      torch::nn::Sequential stage;
      for (int64_t b = 0; b < c.blocks_per_stage; ++b) {
        const int64_t stride = (s > 0 && b == 0) ? 2 : 1;
        stage->push_back(ResidualBlock(in, c.channels[s], stride, c.batch_norm));
        in = c.channels[s];
      }
      parts.push_back(stage);
    }
    parts.push_back(torch::nn::Sequential(Head(in)));
    model = join_chains(parts);
  } else {
    std::vector<torch::nn::Sequential> blocks;
    for (int64_t i = 0; i < c.depth; ++i)
      blocks.push_back(transformer_block(c.d_model, c.heads, c.ff));
    model = join_chains(blocks);  // 2 x depth stages: the planner may cut between the halves
  }
  return model;
}

void mark_residual_blocks(torch::nn::Sequential& chain) {
  ckpt::apply_candidates(*chain, [](const std::string& /*name*/, const torch::nn::Module& module) {
    return dynamic_cast<const ResidualBlockImpl*>(&module) != nullptr;
  });
}

at::Tensor make_input(const ModelConfig& c) {
  torch::manual_seed(1);
  if (c.kind == "mlp") return torch::randn({c.batch, c.width});
  if (c.kind == "resnet") return torch::randn({c.batch, 3, c.image, c.image});
  return torch::randn({c.batch, c.seq, c.d_model});
}

std::string to_json(const ModelConfig& c) {
  std::ostringstream o;
  o << "{\"name\": \"" << c.name << "\", \"kind\": \"" << c.kind << "\", \"batch\": " << c.batch
    << ", \"depth\": " << c.depth << ", \"width\": " << c.width << ", \"activation\": \""
    << c.activation << "\", \"channels\": [";
  for (size_t i = 0; i < c.channels.size(); ++i) o << (i ? ", " : "") << c.channels[i];
  o << "], \"blocks_per_stage\": " << c.blocks_per_stage << ", \"image\": " << c.image
    << ", \"batch_norm\": " << (c.batch_norm ? "true" : "false") << ", \"seq\": " << c.seq
    << ", \"d_model\": " << c.d_model << ", \"heads\": " << c.heads << ", \"ff\": " << c.ff << "}";
  return o.str();
}

}  // namespace models
}  // namespace ckpt
