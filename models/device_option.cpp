#include "device_option.h"

#include <ckpt/emulated_device.h>

#include <torch/cuda.h>
#include <torch/version.h>

#include <cctype>
#include <cstdint>
#include <exception>
#include <optional>
#include <stdexcept>

namespace ckpt {
namespace models {

const char* const kDeviceChoices = "cpu, cuda[:N] or emulated[:N]";

namespace {

// The names in this file's unnamed namespace are the device's own: the model zoo is compiled in
// batches of files (ckpt_unity_build), whose unnamed namespaces are one.
constexpr const char* kEmulatedDeviceName = "emulated";

std::invalid_argument not_a_device(const std::string& text, const std::string& option) {
  return std::invalid_argument(option + " '" + text + "' is not a device; use " + kDeviceChoices);
}

bool names_emulated_device(const std::string& text) {
  const std::string name = kEmulatedDeviceName;
  return text.compare(0, name.size(), name) == 0 &&
         (text.size() == name.size() || text[name.size()] == ':');
}

// A CUDA device or another type LibTorch knows, as LibTorch parses it.
c10::Device parse_libtorch_device(const std::string& text, const std::string& option) {
  std::optional<c10::Device> device;
  try {
    device = c10::Device(text);
  } catch (const std::exception&) {  // c10::Error
    throw not_a_device(text, option);
  }
  // An accelerator without an index: its device 0, as tensors and MemoryTracker take it.
  return device->is_cpu() || device->has_index() ? *device : c10::Device(device->type(), 0);
}

void check_device_index(int64_t index, int64_t count, const std::string& text,
                        const std::string& option, const std::string& kind) {
  if (index < count) return;
  throw std::invalid_argument(option + " " + text + ": there are " + std::to_string(count) + " " +
                              kind + " device(s), " + kind + ":0 to " + kind + ":" +
                              std::to_string(count - 1));
}

// N of "emulated:N" (0 for "emulated"): digits without a leading zero, as LibTorch spells an
// index. Read here, not by LibTorch: before 2.9 the emulated accelerator has no name there.
int64_t emulated_device_index(const std::string& text, const std::string& option) {
  const std::string name = kEmulatedDeviceName;
  if (text.size() == name.size()) return 0;
  const std::string digits = text.substr(name.size() + 1);
  bool valid = !digits.empty() && digits.size() <= 9 && (digits.size() == 1 || digits[0] != '0');
  for (const char c : digits) valid = valid && std::isdigit(static_cast<unsigned char>(c));
  if (!valid) throw not_a_device(text, option);
  return std::stoll(digits);
}

// The emulated accelerator, installed now: before the program's first backward pass, as the
// autograd engine needs. Before LibTorch 2.9 it has no name, generator hooks or memory statistics,
// so dropout's masks could not be replayed nor its memory measured: refused where they are needed.
c10::Device emulated_device_named(const std::string& text, const std::string& option,
                                  EmulatedNeeds needs) {
  if (needs == EmulatedNeeds::kAcceleratorHooks && !emulated_device::has_accelerator_hooks()) {
    throw std::invalid_argument(
        option + " " + text + ": the emulated device needs LibTorch 2.9 or later (" +
        "LibTorch " TORCH_VERSION
        " can't register its name, random generators or memory statistics); use --device cpu");
  }
  const int64_t index = emulated_device_index(text, option);
  emulated_device::install();
  check_device_index(index, emulated_device::device_count(), text, option, kEmulatedDeviceName);
  return emulated_device::device(static_cast<int>(index));
}

}  // namespace

c10::Device parse_device(const std::string& text, const std::string& option, EmulatedNeeds needs) {
  if (names_emulated_device(text)) return emulated_device_named(text, option, needs);
  const c10::Device device = parse_libtorch_device(text, option);
  if (device.is_cpu()) return device;
  if (!device.is_cuda()) {
    throw std::invalid_argument(option + " " + text + ": ckpt runs on " + kDeviceChoices + " only");
  }
  const int64_t count = static_cast<int64_t>(torch::cuda::device_count());
  if (count == 0) {
    throw std::invalid_argument(option + " " + text +
                                ": this machine (or this LibTorch) has no CUDA device; use "
                                "--device cpu, or --device emulated for ckpt's emulated "
                                "accelerator");
  }
  check_device_index(device.index(), count, text, option, "cuda");
  return device;
}

}  // namespace models
}  // namespace ckpt
