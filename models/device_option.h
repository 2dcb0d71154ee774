#pragma once

// The device a program is told to run on: the --device option of the `ckpt` program (`ckpt
// train`, `ckpt bench`) and the device argument of the examples (examples/models). One parser, so
// that every program takes the same spellings and refuses the same devices with the same words:
// the CPU, a CUDA device, or ckpt's emulated accelerator (ckpt::emulated_device), installed only
// when the text names it.

#include <c10/core/Device.h>

#include <string>

namespace ckpt {
namespace models {

/// The devices parse_device accepts, for help texts and errors.
extern const char* const kDeviceChoices;

/// What a program needs of the emulated accelerator.
enum class EmulatedNeeds {
  /// What LibTorch 2.9 added for accelerators of their own: the device's name, its random
  /// generators (dropout's masks replayed) and memory statistics. Before 2.9, `emulated` is
  /// refused. The `ckpt` program and the benchmarks.
  kAcceleratorHooks,
  /// Its devices and operators only, on any LibTorch: the examples, which compare two runs on
  /// the device and read no statistics.
  kDevicesOnly,
};

/// The device that `text`, the value of `option` (named in the errors: "--device"), names: cpu,
/// cuda[:N] (a CUDA device of this machine) or emulated[:N] (the emulated accelerator, which this
/// call installs with its default device count). An accelerator named without an index is its
/// device 0. Throws std::invalid_argument, with a message that starts with `option`, when `text`
/// is no device, or one this LibTorch or machine doesn't have.
///
/// Call it before the program's first backward pass: the emulated accelerator must be installed
/// before the autograd engine starts.
c10::Device parse_device(const std::string& text, const std::string& option = "--device",
                         EmulatedNeeds needs = EmulatedNeeds::kAcceleratorHooks);

}  // namespace models
}  // namespace ckpt
