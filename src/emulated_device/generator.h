#pragma once

// The emulated accelerator's default random generators, one per device. Operators on the device
// run CPU kernels, which draw from a CPU generator: each device's generator owns one, and the
// operator fallback hands it to them (fallback.cpp). Its state is a CPU generator's state.

#include "compat/device_backend.h"

#include <ATen/core/Generator.h>
#include <c10/core/Device.h>

namespace ckpt {
namespace emulated_device {
namespace detail {

class DeviceGenerator final : public compat::DeviceGeneratorBase {
 public:
  explicit DeviceGenerator(c10::DeviceIndex device);

  /// The CPU generator the device's kernels draw from.
  const at::Generator& host() const { return host_; }

  void set_current_seed(uint64_t seed) override;
  uint64_t current_seed() const override;
  uint64_t seed() override;
  void set_state(const c10::TensorImpl& new_state) override;
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;

 protected:
  void set_offset_value(uint64_t offset) override;
  uint64_t offset_value() const override;

 private:
  DeviceGenerator* clone_impl() const override;
  mutable at::Generator host_;  // its mutex is locked in const functions too
};

/// The default generator of `device` (created on first use).
const at::Generator& default_generator(c10::DeviceIndex device);

/// The CPU generator that kernels on the device of `generator` draw from: `generator` must be one
/// of the emulated device's generators.
at::Generator host_generator(const at::Generator& generator);

}  // namespace detail
}  // namespace emulated_device
}  // namespace ckpt
