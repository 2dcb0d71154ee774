#include "guard.h"

#include "devices.h"
#include "streams.h"

#include <c10/util/Exception.h>

namespace ckpt {
namespace emulated_device {
namespace detail {
namespace {
void check_type(c10::Device device) {
  TORCH_CHECK(device.type() == c10::DeviceType::PrivateUse1,
              "ckpt::emulated_device: expected a device of the emulated accelerator, but got ",
              device);
}
}  // namespace

c10::Device Guard::exchangeDevice(c10::Device device) const {
  check_type(device);
  const c10::Device previous = getDevice();
  if (device.index() >= 0 && device.index() != previous.index()) set_current(device.index());
  return previous;
}

c10::Device Guard::getDevice() const {
  return device_of_index(current());
}

void Guard::setDevice(c10::Device device) const {
  check_type(device);
  if (device.index() >= 0) set_current(device.index());
}

void Guard::uncheckedSetDevice(c10::Device device) const noexcept {
  if (device.index() >= 0 && device.index() < count()) {
    try {
      set_current(device.index());
    } catch (...) {  // unreachable: the index was checked; noexcept requires the catch
    }
  }
}

c10::DeviceIndex Guard::deviceCount() const noexcept {
  return count();
}

c10::Stream Guard::getStream(c10::Device device) const noexcept {
  // An invalid index can't raise here: it falls back to device 0, as the default stream.
  const auto index = resolve(device.index());
  if (index < 0 || index >= count()) return c10::Stream(c10::Stream::DEFAULT, device_of_index(0));
  return current_stream(index);
}

c10::Stream Guard::getDefaultStream(c10::Device device) const {
  const auto index = resolve(device.index());
  check_index(index);
  return c10::Stream(c10::Stream::DEFAULT, device_of_index(index));
}

c10::Stream Guard::getStreamFromGlobalPool(c10::Device device, bool /*high_priority*/) const {
  return pool_stream(device.index());
}

c10::Stream Guard::exchangeStream(c10::Stream stream) const noexcept {
  try {
    return exchange_stream(stream);
  } catch (const c10::Error&) {
    return stream;  // not one of ours: LibTorch never passes such a stream to this guard
  }
}

bool Guard::queryStream(const c10::Stream& stream) const {
  return query(stream);
}

void Guard::synchronizeStream(const c10::Stream& stream) const {
  synchronize(stream);
}

void Guard::record(void** event, const c10::Stream& stream, c10::DeviceIndex /*device*/,
                   c10::EventFlag /*flag*/) const {
  record_event(event, stream);
}

void Guard::block(void* event, const c10::Stream& stream) const {
  block_on_event(event, stream);
}

bool Guard::queryEvent(void* event) const {
  return query_event(event);
}

void Guard::destroyEvent(void* event, c10::DeviceIndex /*device*/) const noexcept {
  destroy_event(event);
}

c10::Stream Guard::new_stream(c10::Device device) const {
  return detail::new_stream(device.index());
}

void Guard::synchronize_event(void* event) const {
  detail::synchronize_event(event);
}

void Guard::synchronize_device(c10::DeviceIndex device) const {
  detail::synchronize_device(device);
}

double Guard::elapsed_milliseconds(void* first, void* second) const {
  return detail::elapsed_milliseconds(first, second);
}

}  // namespace detail
}  // namespace emulated_device
}  // namespace ckpt
