#pragma once

// Shared helpers for the LibTorch tests: seeding, exact comparison, error and warning capture.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "compat/torch_compat.h"

#include <c10/util/Exception.h>
#include <torch/version.h>

#include <string>
#include <vector>

namespace ckpt {
namespace test {

/// Seeds LibTorch's generators before every test.
struct SeedingFixture : ::testing::Test {
  SeedingFixture() { torch::manual_seed(0); }
};

/// Equal shapes, dtypes and bits (NaNs at the same places count as equal).
inline ::testing::AssertionResult bit_equal(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.defined() != b.defined()) {
    return ::testing::AssertionFailure() << "one tensor is undefined and the other is not";
  }
  if (!a.defined()) return ::testing::AssertionSuccess();
  if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) {
    return ::testing::AssertionFailure()
           << "shape/dtype differ: " << a.sizes() << " " << a.scalar_type() << " vs " << b.sizes()
           << " " << b.scalar_type();
  }
  if (!torch::equal(a, b)) {
    return ::testing::AssertionFailure()
           << "values differ, max abs difference " << (a - b).abs().max().item<double>();
  }
  return ::testing::AssertionSuccess();
}

/// Python's assertEqual tolerances for float32 (rtol 1.3e-6, atol 1e-5) and float64 (1e-7).
inline ::testing::AssertionResult close(const torch::Tensor& a, const torch::Tensor& b) {
  if (!a.defined() || !b.defined()) return bit_equal(a, b);
  const bool is_double = a.scalar_type() == torch::kDouble;
  if (a.sizes() == b.sizes() &&
      torch::allclose(a, b, is_double ? 1e-7 : 1.3e-6, is_double ? 1e-7 : 1e-5)) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << a << "\nvs\n" << b;
}

/// Gradients of every parameter of `module`, cloned, then zeroed.
inline std::vector<torch::Tensor> take_grads(const torch::nn::Module& module) {
  std::vector<torch::Tensor> grads;
  for (const auto& p : module.parameters()) {
    grads.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
    if (p.grad().defined()) p.mutable_grad() = torch::Tensor();
  }
  return grads;
}

/// Names the instances of tests parameterised on `use_reentrant`.
struct VariantName {
  std::string operator()(const ::testing::TestParamInfo<bool>& param) const {
    return param.param ? "Reentrant" : "NonReentrant";
  }
};

/// Collects the warnings raised while it lives.
class WarningCapture : public ckpt::compat::MessageWarningHandler {
 public:
  WarningCapture() : previous_(ckpt::compat::warning_handler()) {
    ckpt::compat::set_warning_handler(this);
  }
  ~WarningCapture() override { ckpt::compat::set_warning_handler(previous_); }
  void on_warning(const std::string& message) override { messages.push_back(message); }
  bool contains(const std::string& text) const {
    for (const auto& m : messages) {
      if (m.find(text) != std::string::npos) return true;
    }
    return false;
  }
  std::vector<std::string> messages;

 private:
  c10::WarningHandler* previous_;
};

}  // namespace test
}  // namespace ckpt

/// Asserts that `statement` throws a c10::Error whose message contains `substring`.
#define CKPT_EXPECT_THROWS_WITH(statement, substring)                                       \
  do {                                                                                      \
    bool ckpt_thrown_ = false;                                                              \
    try {                                                                                   \
      statement;                                                                            \
    } catch (const c10::Error& e) {                                                         \
      ckpt_thrown_ = true;                                                                  \
      EXPECT_NE(std::string(e.what_without_backtrace()).find(substring), std::string::npos) \
          << "message: " << e.what_without_backtrace();                                     \
    }                                                                                       \
    EXPECT_TRUE(ckpt_thrown_) << "expected an error containing: " << (substring);           \
  } while (0)
