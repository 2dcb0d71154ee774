#pragma once

// The forward pass of `ckpt train --strategy` on a GPT chain, for the data-parallel driver
// (train_distributed.cpp), which trains the same strategies as train_command.cpp.

#include "corpus.h"
#include "gpt.h"
#include "train_args.h"

#include <ATen/core/Tensor.h>
#include <torch/nn/modules/container/sequential.h>
#include <nlohmann/json.hpp>

#include <functional>
#include <string>

namespace ckpt {
namespace cli {

/// The GPT that `ckpt train` builds from its options and the corpus's vocabulary.
models::GptConfig gpt_config(const TrainArgs& args, const Corpus& corpus);

/// The options of a run, for the `config` object of `--json`.
nlohmann::json config_json(const TrainArgs& args);

/// A strategy, ready to run.
struct StrategyForward {
  std::function<at::Tensor(const at::Tensor&)> forward;
  std::string text;  // the strategy as given, such as "sequential:4"
};

/// Parses `args.strategy` (UsageError when it is invalid) and prepares it on `chain`; a planned
/// strategy is profiled on a batch of `args.batch` sequences. `chain` must outlive the result.
StrategyForward strategy_forward(const TrainArgs& args, const Corpus& corpus,
                                 torch::nn::Sequential& chain);

}  // namespace cli
}  // namespace ckpt
