#pragma once

// Streams and events of the emulated accelerator. The default stream of each device runs its work
// at once, on the calling thread. Every other stream has a worker thread that runs its work in
// order, later: a copy enqueued there has not happened until the stream (or an event recorded
// after it) is waited for, as on a GPU. Kernels run on the calling thread; on a non-default
// stream they first wait for the stream's earlier work (fallback.cpp).

#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include <functional>

namespace ckpt {
namespace emulated_device {
namespace detail {

/// The calling thread's current stream on `device` (its default stream unless changed).
c10::Stream current_stream(c10::DeviceIndex device);

/// Makes `stream` the calling thread's current stream on its device; returns the previous one.
c10::Stream exchange_stream(c10::Stream stream);

/// A stream of its own, or one of a small pool shared by all callers.
c10::Stream new_stream(c10::DeviceIndex device);
c10::Stream pool_stream(c10::DeviceIndex device);

/// Runs `task` on `stream`: now for a default stream, after the stream's earlier work otherwise.
void run_on(const c10::Stream& stream, std::function<void()> task);

/// Waits until the work enqueued on `stream` so far has run; rethrows the first error it raised.
void synchronize(const c10::Stream& stream);
bool query(const c10::Stream& stream);
void synchronize_device(c10::DeviceIndex device);

/// Holds (or releases) the work of a non-default stream: queued work waits until released.
void hold(const c10::Stream& stream);
void release(const c10::Stream& stream);

// Events: opaque handles owned by LibTorch's c10::Event, created by the first record().

/// Enqueues, on `stream`, the completion of a new version of the event.
void record_event(void** event, const c10::Stream& stream);
/// Makes `stream`'s later work wait for the event's version recorded so far (nothing if none).
void block_on_event(void* event, const c10::Stream& stream);
bool query_event(void* event);
void synchronize_event(void* event);
void destroy_event(void* event);
/// Milliseconds between the completions of two recorded events.
double elapsed_milliseconds(void* first, void* second);

}  // namespace detail
}  // namespace emulated_device
}  // namespace ckpt
