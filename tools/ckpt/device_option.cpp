#include "device_option.h"

#include "errors.h"

#include <ckpt/emulated_device.h>

#include <c10/util/Exception.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include <optional>

namespace ckpt {
namespace cli {

const char* const kDeviceChoices = "cpu, cuda[:N] or emulated[:N]";

namespace {

constexpr const char* kEmulated = "emulated";

bool names_emulated(const std::string& text) {
  const std::string name = kEmulated;
  return text.compare(0, name.size(), name) == 0 &&
         (text.size() == name.size() || text[name.size()] == ':');
}

c10::Device parse(const std::string& text, const std::string& option) {
  std::optional<c10::Device> device;
  try {
    device = c10::Device(text);
  } catch (const c10::Error&) {
    throw UsageError(option + " '" + text + "' is not a device; use " + kDeviceChoices);
  }
  // An accelerator without an index: its device 0, as tensors and MemoryTracker take it.
  return device->is_cpu() || device->has_index() ? *device : c10::Device(device->type(), 0);
}

void check_index(const c10::Device& device, int64_t count, const std::string& text,
                 const std::string& option, const std::string& kind) {
  if (device.index() < count) return;
  throw UsageError(option + " " + text + ": there are " + std::to_string(count) + " " + kind +
                   " device(s), " + kind + ":0 to " + kind + ":" + std::to_string(count - 1));
}

// The emulated accelerator, installed now: before the program's first backward pass, as the
// autograd engine needs. On LibTorch 1.13 it has no name, generator hooks or memory statistics,
// so dropout's masks could not be replayed nor its memory measured.
c10::Device emulated(const std::string& text, const std::string& option) {
  if (!emulated_device::has_accelerator_hooks()) {
    throw UsageError(option + " " + text + ": the emulated device needs LibTorch 2.9 or later (" +
                     "LibTorch " TORCH_VERSION
                     " can't register its name, random generators or memory statistics); use "
                     "--device cpu");
  }
  emulated_device::install();
  const c10::Device device = parse(text, option);
  check_index(device, emulated_device::device_count(), text, option, kEmulated);
  return device;
}

}  // namespace

c10::Device parse_device_option(const std::string& text, const std::string& option) {
  if (names_emulated(text)) return emulated(text, option);
  const c10::Device device = parse(text, option);
  if (device.is_cpu()) return device;
  if (!device.is_cuda()) {
    throw UsageError(option + " " + text + ": ckpt runs on " + kDeviceChoices + " only");
  }
  const int64_t count = static_cast<int64_t>(torch::cuda::device_count());
  if (count == 0) {
    throw UsageError(option + " " + text +
                     ": this machine (or this LibTorch) has no CUDA device; use --device cpu, or "
                     "--device emulated for ckpt's emulated accelerator");
  }
  check_index(device, count, text, option, "cuda");
  return device;
}

}  // namespace cli
}  // namespace ckpt
