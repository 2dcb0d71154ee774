// The process-wide overrides of per-region options, as PyTorch's set_checkpoint_debug_enabled and
// set_checkpoint_early_stop: each is "no override", true or false.

#include <ckpt/options.h>

#include <atomic>
#include <cstdint>

namespace ckpt {
namespace {
// -1: no override; 0 and 1: every region's option is false or true.
std::atomic<int8_t> debug_override{-1};
std::atomic<int8_t> early_stop_override{-1};
std::atomic<int8_t> check_values_override{-1};

int8_t encode(std::optional<bool> enabled) {
  return enabled ? static_cast<int8_t>(*enabled) : int8_t{-1};
}

std::optional<bool> decode(int8_t value) {
  return value < 0 ? std::nullopt : std::optional<bool>(value == 1);
}
}  // namespace

void set_checkpoint_debug_enabled(std::optional<bool> enabled) {
  debug_override.store(encode(enabled));
}

std::optional<bool> checkpoint_debug_enabled() {
  return decode(debug_override.load());
}

CheckpointDebugGuard::CheckpointDebugGuard(std::optional<bool> enabled)
    : previous_(checkpoint_debug_enabled()) {
  set_checkpoint_debug_enabled(enabled);
}

CheckpointDebugGuard::~CheckpointDebugGuard() {
  set_checkpoint_debug_enabled(previous_);
}

void set_checkpoint_early_stop(std::optional<bool> enabled) {
  early_stop_override.store(encode(enabled));
}

std::optional<bool> checkpoint_early_stop() {
  return decode(early_stop_override.load());
}

CheckpointEarlyStopGuard::CheckpointEarlyStopGuard(std::optional<bool> enabled)
    : previous_(checkpoint_early_stop()) {
  set_checkpoint_early_stop(enabled);
}

CheckpointEarlyStopGuard::~CheckpointEarlyStopGuard() {
  set_checkpoint_early_stop(previous_);
}

void set_checkpoint_check_values(std::optional<bool> enabled) {
  check_values_override.store(encode(enabled));
}

std::optional<bool> checkpoint_check_values() {
  return decode(check_values_override.load());
}

}  // namespace ckpt
