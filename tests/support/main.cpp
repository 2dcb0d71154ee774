// Test entry point: seeds nothing itself; skips *_CUDA tests when no CUDA device is present.

#include <gtest/gtest.h>
#include <torch/cuda.h>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (!torch::cuda::is_available()) {
    std::string filter = ::testing::GTEST_FLAG(filter);
    filter += (filter.find('-') == std::string::npos ? "-" : ":");
    ::testing::GTEST_FLAG(filter) = filter + "*_CUDA";
  }
  return RUN_ALL_TESTS();
}
