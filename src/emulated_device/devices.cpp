#include "devices.h"

#include <c10/util/Exception.h>

#include <array>
#include <atomic>

namespace ckpt {
namespace emulated_device {
namespace detail {
namespace {
std::atomic<c10::DeviceIndex> g_count{0};
std::array<std::atomic<bool>, kMaxDevices> g_used{};
thread_local c10::DeviceIndex t_current = 0;
}  // namespace

c10::DeviceIndex count() {
  return g_count.load();
}

void set_count(c10::DeviceIndex devices) {
  g_count = devices;
}

void check_index(c10::DeviceIndex index) {
  TORCH_CHECK(index >= 0 && index < count(), "ckpt::emulated_device: device index ",
              static_cast<int>(index), " is out of range: the emulated accelerator has ",
              static_cast<int>(count()), " device(s)",
              count() == 0 ? " (call ckpt::emulated_device::install() first)." : ".");
}

c10::DeviceIndex current() {
  return t_current;
}

void set_current(c10::DeviceIndex index) {
  check_index(index);
  t_current = index;
}

c10::DeviceIndex resolve(c10::DeviceIndex index) {
  return index < 0 ? current() : index;
}

void mark_used(c10::DeviceIndex index) {
  g_used[static_cast<size_t>(index)] = true;
}

bool used(c10::DeviceIndex index) {
  return index >= 0 && index < count() && g_used[static_cast<size_t>(index)].load();
}

}  // namespace detail
}  // namespace emulated_device
}  // namespace ckpt
