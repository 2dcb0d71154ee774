#pragma once

// The benchmark models: each is a torch::nn::Sequential of stages that take and return one
// tensor, so that every method (no checkpointing, checkpoint_sequential, planned schedules, and
// Python's torch.utils.checkpoint through bench/compare/torch_checkpoint.py) runs the same chain
// with the same stage boundaries. The Python script builds the same architectures from the same
// ModelConfig (passed as JSON), so any change here must be mirrored there.

#include <ATen/core/Tensor.h>
#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <string>
#include <vector>

namespace ckpt {
namespace models {

/// Sizes of one benchmark model. Fields that a kind does not use stay at their defaults.
struct ModelConfig {
  std::string name;  // "mlp", "resnet", "transformer", "small", "small_gelu"
  std::string kind;  // "mlp" (also "small" and "small_gelu"), "resnet", "transformer"
  int64_t batch = 1;
  // mlp / small / small_gelu: `depth` stages of Linear(width, width) + `activation`.
  int64_t depth = 0;
  int64_t width = 0;
  std::string activation = "tanh";  // or "gelu"
  // resnet: a stem conv (3 -> channels[0]) + BatchNorm + ReLU, then for each entry of `channels`
  // `blocks_per_stage` residual blocks (the first block of every stage but the first halves the
  // resolution with a strided conv and a 1x1 projection), then a head (global average pool +
  // Linear(channels.back(), 10)).
  std::vector<int64_t> channels;
  int64_t blocks_per_stage = 0;
  int64_t image = 0;       // input is batch x 3 x image x image
  bool batch_norm = true;  // false: no BatchNorm layers (conv -> ReLU)
  // transformer: `depth` pre-LayerNorm blocks (explicit 4-head attention, FF of `ff` units with
  // GELU), each two stages: its attention half and its MLP half, joined by the residual stream;
  // input is batch x seq x d_model.
  int64_t seq = 0;
  int64_t d_model = 0;
  int64_t heads = 0;
  int64_t ff = 0;
  std::string description;  // one line for the tables
};

/// The configuration of a model by name, full size or quick (tiny, for tests).
ModelConfig model_config(const std::string& name, bool quick);

/// One line describing the configuration (kept in ModelConfig::description).
std::string describe(const ModelConfig& config);

/// The models of the benchmark tables, in table order (`small_gelu` is for `step_program` only).
std::vector<std::string> model_names();

/// Builds the chain with deterministic weights (seeded).
torch::nn::Sequential build_model(const ModelConfig& config);

/// Marks each residual block of a bench ResNet's chain (`build_model`) as a candidate of
/// `ckpt::PlannedModel` over the two convolution halves its forward marks inside
/// (`ckpt::apply_candidates`), so that a plan may run a block whole, checkpointed, or with its
/// halves checkpointed inside it (docs/any-model.md: mark the blocks, and their parts inside
/// them). Other models' chains are left as they are: each of their stages marks one candidate.
void mark_residual_blocks(torch::nn::Sequential& chain);

/// A deterministic synthetic input for the model (not requiring grad).
at::Tensor make_input(const ModelConfig& config);

/// The configuration as a JSON object, for the Python script.
std::string to_json(const ModelConfig& config);

}  // namespace models
}  // namespace ckpt
