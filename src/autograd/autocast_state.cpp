#include "autocast_state.h"

#include "compat/torch_compat.h"

#include <ATen/autocast_mode.h>

namespace ckpt {
namespace detail {
namespace {

DeviceAutocast read(c10::DeviceType type) {
  return {type, compat::autocast_enabled(type), compat::autocast_dtype(type)};
}

void write(const DeviceAutocast& state) {
  compat::set_autocast_enabled(state.type, state.enabled);
  compat::set_autocast_dtype(state.type, state.dtype);
}

void apply(const AutocastState& state) {
  write(state.cpu);
  if (state.has_device) write(state.device);
  at::autocast::set_autocast_cache_enabled(state.cache_enabled);
}

}  // namespace

AutocastState AutocastState::current(c10::DeviceType device_type) {
  AutocastState state;
  state.cpu = read(c10::DeviceType::CPU);
  state.has_device = device_type != c10::DeviceType::CPU && compat::autocast_available(device_type);
  if (state.has_device) state.device = read(device_type);
  state.cache_enabled = at::autocast::is_autocast_cache_enabled();
  return state;
}

AutocastScope::AutocastScope(const AutocastState& state)
    : previous_(
          AutocastState::current(state.has_device ? state.device.type : c10::DeviceType::CPU)),
      active_(!(previous_ == state)) {
  if (!active_) return;
  apply(state);
  at::autocast::increment_nesting();
}

AutocastScope::~AutocastScope() {
  if (!active_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  apply(previous_);
}

AutocastCacheOff::AutocastCacheOff() : previous_(at::autocast::is_autocast_cache_enabled()) {
  at::autocast::set_autocast_cache_enabled(false);
}

AutocastCacheOff::~AutocastCacheOff() {
  at::autocast::set_autocast_cache_enabled(previous_);
}

}  // namespace detail
}  // namespace ckpt
