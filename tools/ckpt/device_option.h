#pragma once

// The --device option of `ckpt train` and `ckpt bench`: the CPU, a CUDA device, or ckpt's
// emulated accelerator (ckpt::emulated_device), installed only when the option names it.

#include <c10/core/Device.h>

#include <string>

namespace ckpt {
namespace cli {

/// The devices --device accepts, for help texts and errors.
extern const char* const kDeviceChoices;

/// The device that `text`, the value of `option`, names: cpu, cuda[:N] (a CUDA device of this
/// machine) or emulated[:N] (the emulated accelerator, which this call installs; LibTorch 2.9 and
/// later). An accelerator named without an index is its device 0. Throws UsageError when `text`
/// is no device, or one this LibTorch or machine doesn't have.
c10::Device parse_device_option(const std::string& text, const std::string& option = "--device");

}  // namespace cli
}  // namespace ckpt
