#include "generator.h"

#include "devices.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/util/Exception.h>

#include <array>
#include <mutex>

namespace ckpt {
namespace emulated_device {
namespace detail {

DeviceGenerator::DeviceGenerator(c10::DeviceIndex device)
    : compat::DeviceGeneratorBase(device_of_index(device),
                                  c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      host_(at::make_generator<at::CPUGeneratorImpl>(c10::default_rng_seed_val)) {}

// The caller holds this generator's mutex (LibTorch's rule); the host generator's mutex guards
// against the kernels, which lock only that one.

void DeviceGenerator::set_current_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(host_.mutex());
  host_.set_current_seed(seed);
}

uint64_t DeviceGenerator::current_seed() const {
  std::lock_guard<std::mutex> lock(host_.mutex());
  return host_.current_seed();
}

uint64_t DeviceGenerator::seed() {
  std::lock_guard<std::mutex> lock(host_.mutex());
  return host_.seed();
}

void DeviceGenerator::set_state(const c10::TensorImpl& new_state) {
  std::lock_guard<std::mutex> lock(host_.mutex());
  host_.unsafeGetGeneratorImpl()->set_state(new_state);
}

c10::intrusive_ptr<c10::TensorImpl> DeviceGenerator::get_state() const {
  std::lock_guard<std::mutex> lock(host_.mutex());
  return host_.unsafeGetGeneratorImpl()->get_state();
}

// Philox generators (CUDA's) have offsets; the CPU's Mersenne Twister, which the device's kernels
// draw from, has none.
void DeviceGenerator::set_offset_value(uint64_t /*offset*/) {
  TORCH_CHECK(false,
              "ckpt::emulated_device: a device generator is a CPU (Mersenne Twister) "
              "generator, which has no offset: use set_state() instead.");
}

uint64_t DeviceGenerator::offset_value() const {
  TORCH_CHECK(false,
              "ckpt::emulated_device: a device generator is a CPU (Mersenne Twister) "
              "generator, which has no offset: use get_state() instead.");
}

DeviceGenerator* DeviceGenerator::clone_impl() const {
  auto* copy = new DeviceGenerator(device().index());
  std::lock_guard<std::mutex> lock(host_.mutex());
  copy->host_ = host_.clone();
  return copy;
}

const at::Generator& default_generator(c10::DeviceIndex device) {
  check_index(device);
  static std::array<at::Generator, kMaxDevices> generators;
  static std::array<std::once_flag, kMaxDevices> created;
  const auto slot = static_cast<size_t>(device);
  std::call_once(created[slot],
                 [&] { generators[slot] = at::make_generator<DeviceGenerator>(device); });
  return generators[slot];
}

at::Generator host_generator(const at::Generator& generator) {
  TORCH_CHECK(generator.device().type() == c10::DeviceType::PrivateUse1,
              "Expected a generator of the emulated device for an operator on it, but found a ",
              generator.device().type(), " generator.");
  const auto* device_generator = dynamic_cast<DeviceGenerator*>(generator.unsafeGetGeneratorImpl());
  TORCH_CHECK(device_generator != nullptr,
              "Expected a generator of ckpt's emulated device, but found another PrivateUse1 "
              "generator.");
  return device_generator->host();
}

}  // namespace detail
}  // namespace emulated_device
}  // namespace ckpt
