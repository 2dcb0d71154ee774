#include <ckpt/options.h>

#include <atomic>
#include <cstdint>

namespace ckpt {
namespace {
// -1: no override; 0 and 1: every region's debug is false or true.
std::atomic<int8_t> debug_override{-1};

int8_t encode(std::optional<bool> enabled) {
  return enabled ? static_cast<int8_t>(*enabled) : int8_t{-1};
}
}  // namespace

void set_checkpoint_debug_enabled(std::optional<bool> enabled) {
  debug_override.store(encode(enabled));
}

std::optional<bool> checkpoint_debug_enabled() {
  const int8_t value = debug_override.load();
  return value < 0 ? std::nullopt : std::optional<bool>(value == 1);
}

CheckpointDebugGuard::CheckpointDebugGuard(std::optional<bool> enabled)
    : previous_(checkpoint_debug_enabled()) {
  set_checkpoint_debug_enabled(enabled);
}

CheckpointDebugGuard::~CheckpointDebugGuard() {
  set_checkpoint_debug_enabled(previous_);
}

}  // namespace ckpt
