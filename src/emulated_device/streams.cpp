#include "streams.h"

#include "devices.h"

#include <c10/util/Exception.h>

#include <array>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace ckpt {
namespace emulated_device {
namespace detail {
namespace {

// ~~~ A non-default stream: its queue and worker thread ~~~

class StreamQueue {
 public:
  StreamQueue() {
    std::thread([this] { run(); }).detach();
  }

  void enqueue(std::function<void()> task) {
    std::lock_guard<std::mutex> lock(mutex_);
    tasks_.push_back(std::move(task));
    ++enqueued_;
    work_.notify_one();
  }

  void synchronize() {
    std::unique_lock<std::mutex> lock(mutex_);
    const uint64_t target = enqueued_;
    done_.wait(lock, [&] { return completed_ >= target; });
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

  bool idle() {
    std::lock_guard<std::mutex> lock(mutex_);
    return completed_ == enqueued_;
  }

  void hold() {
    std::lock_guard<std::mutex> lock(mutex_);
    ++holds_;
  }

  void release() {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK(holds_ > 0, "ckpt::emulated_device: releasing a stream that is not held.");
    --holds_;
    work_.notify_one();
  }

 private:
  // Runs for the process: queues are never destroyed (streams are copied around freely).
  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      work_.wait(lock, [&] { return !tasks_.empty() && holds_ == 0; });
      auto task = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      std::exception_ptr error;
      try {
        task();
      } catch (...) {
        error = std::current_exception();
      }
      task = nullptr;  // what it captured goes before a synchronize() returns, as a GPU's frees
      lock.lock();
      if (error && !error_) error_ = error;
      ++completed_;
      done_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable work_;  // the worker waits for work, or for a release
  std::condition_variable done_;  // synchronize() waits for completions
  std::deque<std::function<void()>> tasks_;
  uint64_t enqueued_ = 0;
  uint64_t completed_ = 0;
  int holds_ = 0;
  std::exception_ptr error_;
};

// ~~~ The streams of every device ~~~

// Ids 1..kPoolSize are the pool's streams; new_stream() numbers its streams after them.
constexpr c10::StreamId kPoolSize = 4;

struct DeviceStreams {
  std::vector<std::unique_ptr<StreamQueue>> queues{static_cast<size_t>(kPoolSize) + 1};
  c10::StreamId next_pool = 0;
};

struct Registry {
  std::mutex mutex;
  std::array<DeviceStreams, kMaxDevices> devices;
};

Registry& registry() {
  static auto* streams = new Registry();  // kept for the process, as the worker threads are
  return *streams;
}

thread_local std::array<c10::StreamId, kMaxDevices> t_current_streams{};

c10::Stream make_stream(c10::DeviceIndex device, c10::StreamId id) {
  return c10::Stream(c10::Stream::UNSAFE, device_of_index(device), id);
}

// The queue of a non-default stream; null for a default stream.
StreamQueue* queue_of(const c10::Stream& stream) {
  TORCH_CHECK(stream.device_type() == c10::DeviceType::PrivateUse1,
              "ckpt::emulated_device: expected a stream of the emulated device, but got one of ",
              stream.device());
  check_index(stream.device_index());
  if (stream.id() == 0) return nullptr;
  Registry& streams = registry();
  std::lock_guard<std::mutex> lock(streams.mutex);
  auto& queues = streams.devices[static_cast<size_t>(stream.device_index())].queues;
  const auto id = static_cast<size_t>(stream.id());
  TORCH_CHECK(stream.id() > 0 && id < queues.size() && (queues[id] || stream.id() <= kPoolSize),
              "ckpt::emulated_device: ", stream, " was not created by the emulated device.");
  if (!queues[id]) queues[id] = std::make_unique<StreamQueue>();
  return queues[id].get();
}

}  // namespace

c10::Stream current_stream(c10::DeviceIndex device) {
  device = resolve(device);
  check_index(device);
  return make_stream(device, t_current_streams[static_cast<size_t>(device)]);
}

c10::Stream exchange_stream(c10::Stream stream) {
  queue_of(stream);  // checks that the stream is one of ours
  const auto device = stream.device_index();
  auto& current = t_current_streams[static_cast<size_t>(device)];
  return make_stream(device, std::exchange(current, stream.id()));
}

c10::Stream new_stream(c10::DeviceIndex device) {
  device = resolve(device);
  check_index(device);
  Registry& streams = registry();
  std::lock_guard<std::mutex> lock(streams.mutex);
  auto& queues = streams.devices[static_cast<size_t>(device)].queues;
  queues.push_back(std::make_unique<StreamQueue>());
  return make_stream(device, static_cast<c10::StreamId>(queues.size() - 1));
}

c10::Stream pool_stream(c10::DeviceIndex device) {
  device = resolve(device);
  check_index(device);
  Registry& streams = registry();
  std::lock_guard<std::mutex> lock(streams.mutex);
  auto& next = streams.devices[static_cast<size_t>(device)].next_pool;
  const c10::StreamId id = 1 + next;
  next = (next + 1) % kPoolSize;
  return make_stream(device, id);
}

void run_on(const c10::Stream& stream, std::function<void()> task) {
  if (StreamQueue* queue = queue_of(stream)) {
    queue->enqueue(std::move(task));
  } else {
    task();
  }
}

void synchronize(const c10::Stream& stream) {
  if (StreamQueue* queue = queue_of(stream)) queue->synchronize();
}

bool query(const c10::Stream& stream) {
  StreamQueue* queue = queue_of(stream);
  return queue == nullptr || queue->idle();
}

void synchronize_device(c10::DeviceIndex device) {
  device = resolve(device);
  check_index(device);
  std::vector<StreamQueue*> queues;
  {
    Registry& streams = registry();
    std::lock_guard<std::mutex> lock(streams.mutex);
    for (const auto& queue : streams.devices[static_cast<size_t>(device)].queues) {
      if (queue) queues.push_back(queue.get());
    }
  }
  for (StreamQueue* queue : queues) queue->synchronize();
}

void hold(const c10::Stream& stream) {
  StreamQueue* queue = queue_of(stream);
  TORCH_CHECK(queue != nullptr,
              "ckpt::emulated_device: the default stream runs its work at once "
              "on the calling thread and can't be held: hold a stream from "
              "getNewStream or getStreamFromGlobalPool.");
  queue->hold();
}

void release(const c10::Stream& stream) {
  StreamQueue* queue = queue_of(stream);
  TORCH_CHECK(queue != nullptr, "ckpt::emulated_device: the default stream is never held.");
  queue->release();
}

// ~~~ Events ~~~

namespace {

struct Event {
  std::mutex mutex;
  std::condition_variable completed_changed;
  uint64_t recorded = 0;   // versions recorded so far
  uint64_t completed = 0;  // the last version whose stream reached it
  std::chrono::steady_clock::time_point completed_at;
};

// The handle LibTorch holds: the event is shared with the work that will complete it.
using EventHandle = std::shared_ptr<Event>;

std::shared_ptr<Event> event_of(void* handle) {
  return *static_cast<EventHandle*>(handle);
}

uint64_t recorded_version(Event& event) {
  std::lock_guard<std::mutex> lock(event.mutex);
  return event.recorded;
}

void wait_for(Event& event, uint64_t version) {
  std::unique_lock<std::mutex> lock(event.mutex);
  event.completed_changed.wait(lock, [&] { return event.completed >= version; });
}

}  // namespace

void record_event(void** event, const c10::Stream& stream) {
  if (*event == nullptr) *event = new EventHandle(std::make_shared<Event>());
  auto shared = event_of(*event);
  uint64_t version = 0;
  {
    std::lock_guard<std::mutex> lock(shared->mutex);
    version = ++shared->recorded;
  }
  run_on(stream, [shared, version] {
    std::lock_guard<std::mutex> lock(shared->mutex);
    if (version > shared->completed) {
      shared->completed = version;
      shared->completed_at = std::chrono::steady_clock::now();
    }
    shared->completed_changed.notify_all();
  });
}

void block_on_event(void* event, const c10::Stream& stream) {
  if (event == nullptr) return;
  auto shared = event_of(event);
  const uint64_t version = recorded_version(*shared);
  if (version == 0) return;
  run_on(stream, [shared, version] { wait_for(*shared, version); });
}

bool query_event(void* event) {
  if (event == nullptr) return true;
  auto shared = event_of(event);
  std::lock_guard<std::mutex> lock(shared->mutex);
  return shared->completed >= shared->recorded;
}

void synchronize_event(void* event) {
  if (event == nullptr) return;
  auto shared = event_of(event);
  wait_for(*shared, recorded_version(*shared));
}

void destroy_event(void* event) {
  delete static_cast<EventHandle*>(event);
}

double elapsed_milliseconds(void* first, void* second) {
  TORCH_CHECK(first != nullptr && second != nullptr,
              "ckpt::emulated_device: both events must be recorded before elapsedTime.");
  synchronize_event(first);
  synchronize_event(second);
  auto completed_at = [](void* event) {
    const auto shared = event_of(event);
    std::lock_guard<std::mutex> lock(shared->mutex);
    return shared->completed_at;
  };
  return std::chrono::duration<double, std::milli>(completed_at(second) - completed_at(first))
      .count();
}

}  // namespace detail
}  // namespace emulated_device
}  // namespace ckpt
