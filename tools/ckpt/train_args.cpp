#include "train_args.h"

#include "errors.h"
#include "output_path.h"
#include "units.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <thread>

#include <unistd.h>

namespace ckpt {
namespace cli {
namespace {

void check_range(int64_t value, int64_t max, const std::string& option, const std::string& why) {
  if (value < 1) {
    throw UsageError(option + " must be a positive integer, but got " + std::to_string(value));
  }
  if (value > max) {
    throw UsageError(option + " must be at most " + std::to_string(max) + " (" + why +
                     "), but got " + std::to_string(value));
  }
}

}  // namespace

MachineLimits MachineLimits::of_this_machine() {
  MachineLimits machine;
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  machine.memory_bytes = pages > 0 && page_size > 0
                             ? static_cast<double>(pages) * static_cast<double>(page_size)
                             : std::numeric_limits<double>::infinity();
  machine.cores = std::max<int64_t>(1, std::thread::hardware_concurrency());
  return machine;
}

void validate_threads(int64_t threads, const MachineLimits& machine, const std::string& option) {
  check_range(threads, machine.cores, option,
              "this machine's hardware threads; more only slow a step down");
}

double min_training_bytes(const TrainArgs& args) {
  const double layers = static_cast<double>(args.layers);
  const double width = static_cast<double>(args.width);
  const double tokens = static_cast<double>(args.batch) * static_cast<double>(args.context);
  // Per block: qkv, projection and the MLP's two Linears (12 C^2 weights); the embeddings'
  // vocabulary is unknown yet and left out. Weight, gradient and AdamW's two moments: 4 floats.
  const double parameters = layers * 12 * width * width + static_cast<double>(args.context) * width;
  // Per block, at least the attention probabilities [B, H, T, T] and the MLP's hidden [B, T, 4C].
  const double activations =
      layers * tokens *
      (static_cast<double>(args.heads) * static_cast<double>(args.context) + 4 * width);
  return 4.0 * (4 * parameters + activations);
}

void validate_train_args(const TrainArgs& args, const MachineLimits& machine) {
  constexpr int64_t kMaxSize = int64_t{1} << 24;  // keeps every product of sizes in int64
  check_range(args.layers, kMaxSize, "--layers", "the model's size limit");
  check_range(args.width, kMaxSize, "--width", "the model's size limit");
  check_range(args.heads, args.width, "--heads", "--width");
  check_range(args.context, kMaxSize, "--context", "the model's size limit");
  check_range(args.batch, kMaxSize, "--batch", "the model's size limit");
  check_range(args.steps, std::numeric_limits<int>::max(), "--steps", "the step counter");
  validate_threads(args.threads, machine, "--threads");
  if (args.width % args.heads != 0) {
    throw UsageError("--heads (" + std::to_string(args.heads) + ") must divide --width (" +
                     std::to_string(args.width) + ")");
  }
  if (!(args.lr > 0) || !std::isfinite(args.lr)) {
    throw UsageError("--lr must be a positive number, but got " + std::to_string(args.lr));
  }
  if (!(args.dropout >= 0 && args.dropout < 1)) {
    throw UsageError("--dropout must be in [0, 1), but got " + std::to_string(args.dropout));
  }
  const double needed = min_training_bytes(args);
  if (needed > machine.memory_bytes) {
    throw UsageError(
        "these sizes need at least " + format_bytes(static_cast<int64_t>(std::min(needed, 9e18))) +
        " per training step (weights, AdamW state and activations), more than this machine's " +
        format_bytes(static_cast<int64_t>(machine.memory_bytes)) +
        "; lower --layers, --width, --context or --batch");
  }
  check_output_path(args.plot_path, "--plot");
  check_output_path(args.trace_path, "--trace");
  check_output_path(args.json_path, "--json");
  check_output_path(args.chain_path, "--chain");
}

}  // namespace cli
}  // namespace ckpt
