#include "ckpt/plan/chain.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace ckpt {
namespace plan {
namespace {

constexpr const char* kValidate = "ckpt::plan::Chain::validate: ";

void check_time(double value, const std::string& name) {
  if (!(std::isfinite(value) && value >= 0.0)) {
    throw std::invalid_argument(std::string(kValidate) + name +
                                " must be a finite time >= 0, but got " + std::to_string(value) +
                                ". Re-measure the stage or fix the chain description.");
  }
}

void check_size(int64_t value, const std::string& name) {
  if (value < 0) {
    throw std::invalid_argument(std::string(kValidate) + name + " must be >= 0 bytes, but got " +
                                std::to_string(value) +
                                ". Re-measure the stage or fix the chain description.");
  }
}

void check_option(const StorageOption& option, int64_t output_bytes, const std::string& prefix) {
  check_time(option.forward_time, prefix + "forward_time");
  check_time(option.backward_time, prefix + "backward_time");
  check_size(option.saved_bytes, prefix + "saved_bytes");
  check_size(option.forward_tmp_bytes, prefix + "forward_tmp_bytes");
  check_size(option.backward_tmp_bytes, prefix + "backward_tmp_bytes");
  check_size(option.offloaded_bytes, prefix + "offloaded_bytes");
  if (option.saved_bytes < output_bytes) {
    throw std::invalid_argument(
        std::string(kValidate) + prefix +
        "saved_bytes must be at least the stage's output_bytes (" + std::to_string(output_bytes) +
        ") because the saved activations include the output, but got " +
        std::to_string(option.saved_bytes) + ". Use saved_bytes = max(measured, output_bytes).");
  }
}

}  // namespace

StorageOption Stage::option(int k) const {
  if (k < 0 || k >= option_count()) {
    throw std::invalid_argument("ckpt::plan::Stage::option: the option index must be in [0, " +
                                std::to_string(option_count()) + "), but got " + std::to_string(k) +
                                ". Use an option listed by option_count().");
  }
  if (k == 0) {
    return StorageOption{forward_all_time >= 0 ? forward_all_time : forward_time,
                         backward_time,
                         saved_bytes,
                         forward_all_tmp_bytes >= 0 ? forward_all_tmp_bytes : forward_tmp_bytes,
                         backward_tmp_bytes,
                         /*name=*/{},
                         /*offloaded_bytes=*/0};
  }
  return alternatives[static_cast<size_t>(k - 1)];
}

int64_t Chain::activation_bytes(int i) const {
  if (i < 0 || i > size()) {
    throw std::invalid_argument("ckpt::plan::Chain::activation_bytes: the index must be in [0, " +
                                std::to_string(size()) + "], but got " + std::to_string(i) +
                                ". x_0 is the input and x_L the chain's output.");
  }
  return i == 0 ? input_bytes : stages[static_cast<size_t>(i - 1)].output_bytes;
}

namespace {}  // namespace

double Chain::copy_time(int64_t bytes) const {
  return host_bandwidth > 0 ? static_cast<double>(bytes) / host_bandwidth : 0.0;
}

double Chain::forward_all_time(const StorageOption& option) const {
  return std::max(option.forward_time, copy_time(option.offloaded_bytes));
}

double Chain::backward_time(const StorageOption& option) const {
  return std::max(option.backward_time, copy_time(option.offloaded_bytes));
}

int64_t Chain::max_host_bytes() const {
  int64_t total = 0;
  for (const Stage& stage : stages) {
    int64_t largest = 0;
    for (const StorageOption& option : stage.alternatives) {
      largest = std::max(largest, option.offloaded_bytes);
    }
    total += largest;  // validate() bounds the sum of every size by kMaxTotalBytes
  }
  return total;
}

namespace {

bool option_ok(const StorageOption& option, int64_t output_bytes) {
  auto time_ok = [](double value) { return std::isfinite(value) && value >= 0.0; };
  return time_ok(option.forward_time) && time_ok(option.backward_time) &&
         option.saved_bytes >= output_bytes && option.forward_tmp_bytes >= 0 &&
         option.backward_tmp_bytes >= 0 && option.offloaded_bytes >= 0;
}

// Every byte count of the chain, summed without overflow (saturating at kMaxTotalBytes + 1), and
// every time. The planner adds sizes of tensors alive together and times of recomputed forwards;
// with the totals bounded, none of those sums can overflow int64 or reach infinity.
struct Totals {
  int64_t bytes = 0;
  double time = 0.0;

  void add_bytes(int64_t value) {
    if (value <= 0) return;
    bytes = value > Chain::kMaxTotalBytes - bytes ? Chain::kMaxTotalBytes + 1 : bytes + value;
  }
  bool ok() const { return bytes <= Chain::kMaxTotalBytes && time <= Chain::kMaxTotalTime; }
};

Totals totals(const Chain& chain) {
  Totals totals;
  totals.add_bytes(chain.input_bytes);
  totals.add_bytes(chain.random_state_bytes);
  totals.add_bytes(chain.random_state_bytes);
  for (const Stage& stage : chain.stages) {
    totals.add_bytes(stage.output_bytes);
    totals.add_bytes(stage.random_state_bytes);
    totals.add_bytes(stage.buffer_bytes);
    totals.add_bytes(stage.kept_buffer_bytes);
    totals.add_bytes(stage.forward_tmp_bytes);
    totals.add_bytes(stage.gradient_bytes);
    totals.time += stage.forward_time;
    for (int k = 0; k < stage.option_count(); ++k) {
      const StorageOption option = stage.option(k);
      totals.add_bytes(option.saved_bytes);
      totals.add_bytes(option.forward_tmp_bytes);
      totals.add_bytes(option.backward_tmp_bytes);
      totals.add_bytes(option.offloaded_bytes);
      // The times charged, copies included (see Chain::forward_all_time).
      totals.time += chain.forward_all_time(option) + chain.backward_time(option);
    }
  }
  return totals;
}

// Whether the stage passes check_stage, without building any message.
bool stage_ok(const Stage& stage) {
  bool ok = stage.output_bytes >= 0 && stage.forward_tmp_bytes >= 0 && stage.gradient_bytes >= 0 &&
            stage.random_state_bytes >= 0 && stage.buffer_bytes >= 0 &&
            stage.kept_buffer_bytes >= 0 && stage.kept_buffer_bytes <= stage.buffer_bytes &&
            stage.forward_all_tmp_bytes >= -1 && std::isfinite(stage.forward_time) &&
            stage.forward_time >= 0 &&
            (stage.forward_all_time == -1.0 || stage.forward_all_time >= 0) &&
            option_ok(stage.option(0), stage.output_bytes);
  for (const StorageOption& option : stage.alternatives) {
    ok = ok && option_ok(option, stage.output_bytes);
  }
  return ok;
}

// Throws std::invalid_argument naming the first bad field of stage i.
void check_stage(const Stage& stage, size_t i) {
  const std::string name = "stages[" + std::to_string(i) + "].";
  check_size(stage.output_bytes, name + "output_bytes");
  check_size(stage.forward_tmp_bytes, name + "forward_tmp_bytes");
  check_size(stage.gradient_bytes, name + "gradient_bytes");
  check_size(stage.random_state_bytes, name + "random_state_bytes");
  check_size(stage.buffer_bytes, name + "buffer_bytes");
  check_size(stage.kept_buffer_bytes, name + "kept_buffer_bytes");
  if (stage.kept_buffer_bytes > stage.buffer_bytes) {
    throw std::invalid_argument(std::string(kValidate) + name +
                                "kept_buffer_bytes must be at most buffer_bytes (the kept "
                                "copies are of some of the stage's buffers), but got " +
                                std::to_string(stage.kept_buffer_bytes) + " > " +
                                std::to_string(stage.buffer_bytes) + ".");
  }
  if (stage.forward_all_tmp_bytes < -1) {
    throw std::invalid_argument(std::string(kValidate) + name +
                                "forward_all_tmp_bytes must be >= 0 bytes, or -1 for \"the same "
                                "as forward_tmp_bytes\", but got " +
                                std::to_string(stage.forward_all_tmp_bytes) + ".");
  }
  check_time(stage.forward_time, name + "forward_time");
  if (!(stage.forward_all_time == -1.0 || stage.forward_all_time >= 0)) {
    throw std::invalid_argument(std::string(kValidate) + name +
                                "forward_all_time must be >= 0 seconds, or -1 for \"the same "
                                "as forward_time\", but got " +
                                std::to_string(stage.forward_all_time) + ".");
  }
  for (int k = 0; k < stage.option_count(); ++k) {
    const std::string prefix =
        k == 0 ? name : name + "alternatives[" + std::to_string(k - 1) + "].";
    check_option(stage.option(k), stage.output_bytes, prefix);
  }
}

// Throws std::invalid_argument when the chain's sums leave the planner's exact arithmetic.
void check_totals(const Chain& chain) {
  const Totals sums = totals(chain);
  if (sums.bytes > Chain::kMaxTotalBytes) {
    throw std::invalid_argument(std::string(kValidate) +
                                "the sizes of the chain add up to more than 2^60 bytes (1 EiB), "
                                "the planner's limit. Give the sizes in bytes, not bits or "
                                "elements, or plan a shorter chain.");
  }
  if (!(std::isfinite(chain.host_bandwidth) && chain.host_bandwidth >= 0)) {
    throw std::invalid_argument(std::string(kValidate) +
                                "host_bandwidth must be a finite number of bytes per unit of time "
                                ">= 0 (0: copies take no time), but got " +
                                std::to_string(chain.host_bandwidth) + ".");
  }
  if (!(sums.time <= Chain::kMaxTotalTime)) {
    throw std::invalid_argument(std::string(kValidate) + "the times of the chain add up to " +
                                std::to_string(sums.time) +
                                ", above the planner's limit of 1e200. Give times in seconds.");
  }
}

}  // namespace

void Chain::validate() const {
  // Fast path without building messages (the simulator validates on every call).
  bool ok = !stages.empty() && input_bytes >= 0 && random_state_bytes >= 0 &&
            std::isfinite(host_bandwidth) && host_bandwidth >= 0;
  for (size_t i = 0; ok && i < stages.size(); ++i) ok = stage_ok(stages[i]);
  if (ok && totals(*this).ok()) return;
  if (stages.empty()) {
    throw std::invalid_argument(std::string(kValidate) +
                                "the chain must have at least one stage, but got 0. Add the "
                                "stages of the model before planning.");
  }
  check_size(input_bytes, "input_bytes");
  check_size(random_state_bytes, "random_state_bytes");
  for (size_t i = 0; i < stages.size(); ++i) check_stage(stages[i], i);
  check_totals(*this);
}

int64_t Chain::executor_state_reserve() const {
  int64_t stashes = 0, kept_buffers = 0, largest_buffers = 0;
  for (const Stage& stage : stages) {
    stashes += stage.random_state_bytes;
    kept_buffers += stage.kept_buffer_bytes;
    largest_buffers = std::max(largest_buffers, stage.buffer_bytes);
  }
  // Every first forward comes before the loss: it holds the stash and then reads the state
  // again, or holds the buffers' copies. A later forward holds the buffers' copies, and where a
  // stage keeps a stash, the caller's state (from the loss on) and the one it puts aside.
  const int64_t first_forward = random_state_bytes + std::max(random_state_bytes, largest_buffers);
  const int64_t later_forward = (stashes == 0 ? 0 : 2 * random_state_bytes) + largest_buffers;
  return stashes + kept_buffers + std::max(first_forward, later_forward);
}

Chain scale_times(Chain chain, double factor) {
  if (!(factor > 0 && std::isfinite(factor))) {
    throw std::invalid_argument(
        "ckpt::plan::scale_times: the factor must be positive and finite, "
        "but got " +
        std::to_string(factor) + ".");
  }
  for (Stage& stage : chain.stages) {
    stage.forward_time *= factor;
    stage.backward_time *= factor;
    if (stage.forward_all_time >= 0) stage.forward_all_time *= factor;
    for (StorageOption& option : stage.alternatives) {
      option.forward_time *= factor;
      option.backward_time *= factor;
    }
  }
  chain.host_bandwidth /= factor;  // bytes per unit of time: the unit grows by `factor`
  return chain;
}

Chain homogeneous_chain(int stages, double forward_time, double backward_time,
                        int64_t activation_bytes, int64_t saved_bytes) {
  if (stages < 1) {
    throw std::invalid_argument(
        "ckpt::plan::homogeneous_chain: stages must be at least 1, but got " +
        std::to_string(stages) + ". Pass the number of stages of the chain.");
  }
  Chain chain;
  chain.input_bytes = activation_bytes;
  Stage stage;
  stage.forward_time = forward_time;
  stage.backward_time = backward_time;
  stage.output_bytes = activation_bytes;
  stage.saved_bytes = saved_bytes;
  chain.stages.assign(static_cast<size_t>(stages), stage);
  chain.validate();
  return chain;
}

}  // namespace plan
}  // namespace ckpt
