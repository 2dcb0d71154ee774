// Test entry point. Tests named *_CUDA skip themselves without a GPU; the device tests have their
// own (tests/device/main.cpp).

#include <gtest/gtest.h>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
