#include "autocast_state.h"

#include <ATen/autocast_mode.h>
#include <torch/version.h>

namespace ckpt {
namespace detail {
namespace {

// LibTorch 2.4 replaced the per-device autocast functions with device-generic ones and deprecated
// the old names; this is the one place that knows.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
bool is_enabled(c10::DeviceType type) {
  return at::autocast::is_autocast_enabled(type);
}
void set_enabled(c10::DeviceType type, bool on) {
  at::autocast::set_autocast_enabled(type, on);
}
c10::ScalarType get_dtype(c10::DeviceType type) {
  return at::autocast::get_autocast_dtype(type);
}
void set_dtype(c10::DeviceType type, c10::ScalarType t) {
  at::autocast::set_autocast_dtype(type, t);
}
#else
bool is_enabled(c10::DeviceType type) {
  return type == c10::DeviceType::CPU ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
}
void set_enabled(c10::DeviceType type, bool on) {
  if (type == c10::DeviceType::CPU) {
    at::autocast::set_cpu_enabled(on);
  } else {
    at::autocast::set_enabled(on);
  }
}
c10::ScalarType get_dtype(c10::DeviceType type) {
  return type == c10::DeviceType::CPU ? at::autocast::get_autocast_cpu_dtype()
                                      : at::autocast::get_autocast_gpu_dtype();
}
void set_dtype(c10::DeviceType type, c10::ScalarType t) {
  if (type == c10::DeviceType::CPU) {
    at::autocast::set_autocast_cpu_dtype(t);
  } else {
    at::autocast::set_autocast_gpu_dtype(t);
  }
}
#endif

void apply(const AutocastState& state) {
  set_enabled(c10::DeviceType::CPU, state.cpu_enabled);
  set_dtype(c10::DeviceType::CPU, state.cpu_dtype);
  set_enabled(c10::DeviceType::CUDA, state.cuda_enabled);
  set_dtype(c10::DeviceType::CUDA, state.cuda_dtype);
  at::autocast::set_autocast_cache_enabled(state.cache_enabled);
}

}  // namespace

AutocastState AutocastState::current() {
  AutocastState state;
  state.cpu_enabled = is_enabled(c10::DeviceType::CPU);
  state.cpu_dtype = get_dtype(c10::DeviceType::CPU);
  state.cuda_enabled = is_enabled(c10::DeviceType::CUDA);
  state.cuda_dtype = get_dtype(c10::DeviceType::CUDA);
  state.cache_enabled = at::autocast::is_autocast_cache_enabled();
  return state;
}

AutocastScope::AutocastScope(const AutocastState& state)
    : previous_(AutocastState::current()), active_(!(previous_ == state)) {
  if (!active_) return;
  apply(state);
  at::autocast::increment_nesting();
}

AutocastScope::~AutocastScope() {
  if (!active_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  apply(previous_);
}

}  // namespace detail
}  // namespace ckpt
