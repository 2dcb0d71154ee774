// DefaultDeviceType and the inference of the device type whose RNG a region preserves.

#include <ckpt/options.h>

#include "autograd/rng_state.h"
#include "compat/torch_compat.h"

#include <c10/util/Exception.h>

#include <atomic>
#include <sstream>

namespace ckpt {
namespace {
// -1 until set: the current accelerator then, as in PyTorch's newest DefaultDeviceType.
std::atomic<int> g_default_device_type{-1};
}  // namespace

void DefaultDeviceType::set_device_type(c10::DeviceType type) {
  g_default_device_type = static_cast<int>(type);
}

c10::DeviceType DefaultDeviceType::get_device_type() {
  const int set = g_default_device_type.load();
  if (set >= 0) return static_cast<c10::DeviceType>(set);
  return compat::current_accelerator().value_or(c10::DeviceType::CPU);
}

namespace detail {

c10::DeviceType infer_device_type(const std::vector<at::Tensor>& tensors) {
  std::vector<c10::DeviceType> types;
  for (const auto& tensor : tensors) {
    if (!tensor.defined()) continue;
    const auto type = tensor.device().type();
    if (type == c10::DeviceType::CPU) continue;
    if (std::find(types.begin(), types.end(), type) == types.end()) types.push_back(type);
  }
  if (types.empty()) return DefaultDeviceType::get_device_type();
  const bool has_cuda = std::find(types.begin(), types.end(), c10::DeviceType::CUDA) != types.end();
  if (types.size() > 1) {
    std::ostringstream names;
    for (size_t i = 0; i < types.size(); ++i) {
      names << (i ? ", " : "") << c10::DeviceTypeName(types[i], /*lower_case=*/true);
    }
    TORCH_WARN(
        "ckpt::checkpoint: Tensor arguments, excluding CPU tensors, are detected on at least two "
        "types of devices. Device state will only be saved for devices of a single device type, "
        "and the remaining devices will be ignored. Consequently, if any checkpointed functions "
        "involve randomness, this may result in incorrect gradients. (CUDA is preferred when "
        "present; otherwise the first device type found is used.)\nDevice types: [",
        names.str(), "] first device type: ", c10::DeviceTypeName(types[0], true));
  }
  return has_cuda ? c10::DeviceType::CUDA : types[0];
}

}  // namespace detail
}  // namespace ckpt
