#include "strategy.h"

#include <ckpt/selective.h>
#include <ckpt/sequential.h>

#include <cctype>
#include <stdexcept>

namespace ckpt {
namespace models {
namespace {

// K of "name:K", a positive integer (the message is the one of the program's other counts).
int64_t parse_segments(const std::string& text, const std::string& name) {
  const auto begin = text.find_first_not_of(" \t");
  const auto end = text.find_last_not_of(" \t");
  const std::string value = begin == std::string::npos ? "" : text.substr(begin, end - begin + 1);
  bool digits = !value.empty() && value.size() < 19;
  for (char c : value) digits = digits && std::isdigit(static_cast<unsigned char>(c));
  const int64_t segments = digits ? std::stoll(value) : 0;
  if (segments < 1) {
    throw std::invalid_argument("--strategy " + name +
                                ":K: K must be a positive integer, but got '" + text + "'");
  }
  return segments;
}

Strategy parse_segmented(const std::string& text, const std::string& name, const std::string& value,
                         int64_t stage_count, const std::string& stage_count_note) {
  const bool per_stage_default = name == "selective" || name == "offload";
  if (value.empty() && (!per_stage_default || text.find(':') != std::string::npos)) {
    throw std::invalid_argument(
        "--strategy " + name + ":K needs a number of segments K, e.g. " + name + ":4" +
        (per_stage_default ? " (or " + name + " alone: one per stage)" : ""));
  }
  // selective and offload alone: every stage is its own region, as selective recompute runs per
  // layer and offload_wrapper wraps each block.
  const int64_t segments = value.empty() ? stage_count : parse_segments(value, name);
  if (segments > stage_count) {
    throw std::invalid_argument(
        "--strategy " + text + ": K must be between 1 and the number of stages (" +
        std::to_string(stage_count) + stage_count_note + "), but got " + value);
  }
  Strategy strategy = name == "selective" ? Strategy::selective(segments)
                      : name == "offload" ? Strategy::offload(segments)
                                          : Strategy::sequential(segments, name != "sequential");
  strategy.text = text;
  return strategy;
}

Strategy parse_budget(const std::string& text, const std::string& value) {
  if (value.empty()) {
    throw std::invalid_argument(
        "--strategy budget:B needs a budget, in bytes (budget:64MiB) or as a "
        "percentage of the no-checkpoint peak (budget:40%)");
  }
  Strategy strategy;
  strategy.kind = Strategy::Kind::Budget;
  strategy.text = text;
  try {
    strategy.budget = plan::Budget::parse(value);
  } catch (const std::invalid_argument& error) {
    throw std::invalid_argument("--strategy " + text + ": " + error.what());
  }
  return strategy;
}

// A Sequential, Selective or Offload strategy of `segments` segments, spelled "name:segments".
Strategy segmented(Strategy::Kind kind, int64_t segments, const std::string& name) {
  Strategy strategy;
  strategy.kind = kind;
  strategy.segments = segments;
  strategy.text = name + ":" + std::to_string(segments);
  return strategy;
}

}  // namespace

Strategy Strategy::sequential(int64_t segments, bool reentrant) {
  Strategy strategy =
      segmented(Kind::Sequential, segments, reentrant ? "sequential_reentrant" : "sequential");
  strategy.reentrant = reentrant;
  return strategy;
}

Strategy Strategy::selective(int64_t segments) {
  return segmented(Kind::Selective, segments, "selective");
}

Strategy Strategy::offload(int64_t segments) {
  return segmented(Kind::Offload, segments, "offload");
}

Strategy parse_strategy(const std::string& text, int64_t stage_count,
                        const std::string& stage_count_note) {
  const auto colon = text.find(':');
  const std::string name = text.substr(0, colon);
  const std::string value = colon == std::string::npos ? "" : text.substr(colon + 1);
  if (name == "none" && colon == std::string::npos) return Strategy{};
  if (name == "sequential" || name == "sequential_reentrant" || name == "selective" ||
      name == "offload") {
    return parse_segmented(text, name, value, stage_count, stage_count_note);
  }
  if (name == "budget") return parse_budget(text, value);
  throw std::invalid_argument(
      "unknown strategy '" + text +
      "'; use none, sequential:K (K segments), selective or selective:K (K segments that keep "
      "matrix products), offload or offload:K (K segments whose activations go to host memory) "
      "or budget:B (B bytes such as 64MiB, or a percentage of the "
      "no-checkpoint peak such as 40%)");
}

StorageModes parse_storage_modes(const std::string& list) {
  try {
    return StorageModes::standard().select(list);
  } catch (const std::invalid_argument& error) {
    throw std::invalid_argument(std::string("--storage-modes: ") + error.what());
  }
}

std::string storage_modes_help() {
  std::string help =
      "Storage modes the planner may give a stage under budget:B, comma-separated, or none:";
  for (const StorageMode& mode : StorageModes::standard().all()) {
    help += " " + mode.name + " (" + mode.summary + ");";
  }
  help.back() = '.';
  return help;
}

CheckpointOptions checkpoint_options(const Strategy& strategy) {
  CheckpointOptions options;
  options.use_reentrant(strategy.reentrant);
  if (strategy.kind == Strategy::Kind::Selective) options.policy(save_matmuls());
  if (strategy.kind == Strategy::Kind::Offload) {
    options.offload(true).offload_options(strategy.offload_options);
  }
  return options;
}

Forward chain_forward(const Strategy& strategy, torch::nn::Sequential chain) {
  switch (strategy.kind) {
    case Strategy::Kind::None:
      return [chain](const at::Tensor& x) mutable { return chain->forward(x); };
    case Strategy::Kind::Sequential:
    case Strategy::Kind::Selective:
    case Strategy::Kind::Offload:
      return [chain, segments = strategy.segments,
              options = checkpoint_options(strategy)](const at::Tensor& x) {
        return checkpoint_sequential(chain, segments, x, options);
      };
    case Strategy::Kind::Budget:
      break;
  }
  throw std::invalid_argument("--strategy " + strategy.text +
                              ": a budget runs a PlannedSequential, which the caller plans");
}

}  // namespace models
}  // namespace ckpt
