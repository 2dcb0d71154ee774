// ckpt::MemoryTracker: exact byte counts, peaks per tracker, thread safety.

#include <ckpt/memory_tracker.h>
#include <ckpt/profiler.h>

#include "support/support.h"

#include <thread>

namespace memory_tracker_test {

TEST(MemoryTrackerTest, CountsLiveBytesExactly) {
  ckpt::MemoryTracker tracker;
  const int64_t before = tracker.current_bytes();
  {
    auto t = torch::empty({1000}, torch::kFloat);
    EXPECT_EQ(tracker.current_bytes() - before, 4000);
    auto u = torch::empty({10}, torch::kDouble);
    EXPECT_EQ(tracker.current_bytes() - before, 4080);
  }
  EXPECT_EQ(tracker.current_bytes(), before);
  EXPECT_EQ(tracker.peak_bytes() - before, 4080);
}

TEST(MemoryTrackerTest, PeakDropsAfterResetPeak) {
  ckpt::MemoryTracker tracker;
  { auto big = torch::empty({1 << 20}); }
  const int64_t base = tracker.current_bytes();
  EXPECT_GE(tracker.peak_bytes(), base + (4 << 20));
  tracker.reset_peak();
  EXPECT_EQ(tracker.peak_bytes(), base);
  { auto small = torch::empty({256}); }
  EXPECT_EQ(tracker.peak_bytes(), base + 1024);
}

TEST(MemoryTrackerTest, TrackersKeepTheirOwnPeaks) {
  ckpt::MemoryTracker outer;
  { auto big = torch::empty({1 << 18}); }
  ckpt::MemoryTracker inner;
  EXPECT_EQ(inner.peak_bytes(), inner.current_bytes());
  EXPECT_GE(outer.peak_bytes(), outer.current_bytes() + (1 << 20));
}

TEST(MemoryTrackerTest, ThreadSafe) {
  ckpt::MemoryTracker tracker;
  const int64_t before = tracker.current_bytes();
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([] {
      for (int j = 0; j < 2000; ++j) {
        auto t = torch::empty({64 + j % 7});
        (void)t;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(tracker.current_bytes(), before);
  EXPECT_GE(tracker.peak_bytes() - before, 4 * 64);
}

// Runs `fn` on another thread and waits for it.
template <class F>
void on_another_thread(F fn) {
  std::thread thread(fn);
  thread.join();
}

TEST(MemoryTrackerTest, CallingThreadScopeIgnoresOtherThreads) {
  ckpt::MemoryTracker process;
  ckpt::MemoryTracker mine(c10::Device(c10::DeviceType::CPU), ckpt::MemoryScope::CallingThread);
  const int64_t before = mine.current_bytes();
  const int64_t process_before = process.current_bytes();
  at::Tensor kept;
  on_another_thread([&] {
    kept = torch::empty({1 << 16});  // 256 KiB, still live after the thread ends
    auto freed = torch::empty({1 << 18});
  });
  EXPECT_EQ(mine.current_bytes(), before);
  EXPECT_EQ(mine.peak_bytes(), before);
  EXPECT_EQ(process.current_bytes() - process_before, 1 << 18);
  EXPECT_GE(process.peak_bytes() - process_before, (1 << 18) + (1 << 20));

  auto own = torch::empty({1000});
  EXPECT_EQ(mine.current_bytes() - before, 4000);
  EXPECT_EQ(mine.peak_bytes() - before, 4000);
}

// A block allocated by a counted thread counts down when any thread frees it, even after the
// tracker is gone.
TEST(MemoryTrackerTest, CallingThreadScopeCountsFreesOnOtherThreads) {
  at::Tensor outlives;
  {
    ckpt::MemoryTracker mine(c10::Device(c10::DeviceType::CPU), ckpt::MemoryScope::CallingThread);
    const int64_t before = mine.current_bytes();
    auto block = torch::empty({1024});
    outlives = torch::empty({2048});
    EXPECT_EQ(mine.current_bytes() - before, 4096 + 8192);
    on_another_thread([moved = std::move(block)]() mutable { moved.reset(); });
    EXPECT_EQ(mine.current_bytes() - before, 8192);
    EXPECT_EQ(mine.peak_bytes() - before, 4096 + 8192);
  }
  on_another_thread([moved = std::move(outlives)]() mutable { moved.reset(); });
}

TEST(MemoryTrackerTest, CallingThreadScopeIsForTheCpuOnly) {
  CKPT_EXPECT_THROWS_WITH(
      ckpt::MemoryTracker(c10::Device(c10::DeviceType::CUDA), ckpt::MemoryScope::CallingThread),
      "counts CPU allocations only");
}

TEST(MemoryTrackerTest, ADeviceWhoseMemoryCannotBeMeasuredIsAnError) {
  // The meta device allocates nothing real: outside a ckpt::ModeledDevice (which counts it as a
  // device would, tests/models/modeled_device_test.cpp), a tracker must refuse it rather than
  // report zero.
  const c10::Device meta(c10::DeviceType::Meta);
  EXPECT_FALSE(ckpt::MemoryTracker::can_measure(meta));
  CKPT_EXPECT_THROWS_WITH(ckpt::MemoryTracker tracker(meta), "can't be measured");
  EXPECT_TRUE(ckpt::MemoryTracker::can_measure(c10::Device(c10::DeviceType::CPU)));
}

TEST(MemoryTrackerTest, CudaWithoutADeviceIsAnError) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "a CUDA device is present";
  CKPT_EXPECT_THROWS_WITH(ckpt::MemoryTracker tracker(torch::kCUDA), "ckpt:");
}

TEST(ProfilerDeviceTest, ProfilingOnADeviceThatCannotBeMeasuredIsAnError) {
  std::vector<torch::nn::AnyModule> stages{torch::nn::AnyModule(torch::nn::Linear(4, 4))};
  auto x = torch::empty({2, 4}, torch::TensorOptions().device(torch::kMeta));
  CKPT_EXPECT_THROWS_WITH(ckpt::profile_chain(stages, x), "can't be measured");
}

}  // namespace memory_tracker_test
