// Test entry point. Tests named *_CUDA skip themselves (CKPT_SKIP_WITHOUT_CUDA) without a GPU.

#include <gtest/gtest.h>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
