#pragma once

// Shared helpers for the LibTorch tests: seeding, exact comparison, error and warning capture.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "compat/torch_compat.h"
#include "compat/version.h"

#include <c10/util/Exception.h>
#include <torch/version.h>

#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace ckpt {
namespace test {

/// Seeds LibTorch's generators before every test.
struct SeedingFixture : ::testing::Test {
  SeedingFixture() { torch::manual_seed(0); }
};

/// The tensor's bytes as integers of its element's width (a complex element as two), detached,
/// on the CPU and contiguous: equal exactly where the bits are.
inline torch::Tensor bits_of(const torch::Tensor& t) {
  torch::Tensor plain = t.detach().cpu().contiguous();
  if (plain.is_complex()) plain = torch::view_as_real(plain.resolve_conj());
  switch (plain.element_size()) {
    case 1:
      return plain.view(torch::kUInt8);
    case 2:
      return plain.view(torch::kInt16);
    case 4:
      return plain.view(torch::kInt32);
    case 8:
      return plain.view(torch::kInt64);
  }
  TORCH_CHECK(false, "bit_equal: no integer type of ", plain.element_size(), " bytes for ",
              t.scalar_type());
}

/// Equal dtypes, shapes, devices and bits: NaNs with the same bits are equal, and -0.0 and 0.0
/// are not (torch::equal compares values, which makes both the other way round).
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
  if (a.device() != b.device()) {
    return ::testing::AssertionFailure()
           << "devices differ: " << a.device() << " vs " << b.device();
  }
  const torch::Tensor a_bits = bits_of(a).flatten(), b_bits = bits_of(b).flatten();
  const torch::Tensor differ = a_bits.ne(b_bits);
  const int64_t count = differ.sum().item<int64_t>();
  if (count == 0) return ::testing::AssertionSuccess();
  const int64_t first = differ.nonzero()[0][0].item<int64_t>();
  auto failure = ::testing::AssertionFailure();
  failure << count << " of " << differ.numel()
          << " values differ in their bits; the first at flat index " << first << " (bits "
          << a_bits[first].item<int64_t>() << " vs " << b_bits[first].item<int64_t>() << ")";
  if (a.is_floating_point()) {
    failure << "; max abs difference " << (a.detach() - b.detach()).abs().max().item<double>();
  }
  return failure;
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

/// Copies of `module`'s buffers (BatchNorm's statistics), for `restore_buffers`.
inline std::vector<torch::Tensor> copy_buffers(const torch::nn::Module& module) {
  std::vector<torch::Tensor> copies;
  for (const auto& buffer : module.buffers()) copies.push_back(buffer.clone());
  return copies;
}

/// Writes `copies` (from `copy_buffers`) back into `module`'s buffers: each step starts from them.
inline void restore_buffers(const torch::nn::Module& module,
                            const std::vector<torch::Tensor>& copies) {
  torch::NoGradGuard no_grad;
  const auto buffers = module.buffers();
  for (size_t i = 0; i < buffers.size(); ++i) buffers[i].copy_(copies.at(i));
}

/// A non-owning pointer to a graph node, matching compat::NodePtr (`expired()` tells if it died):
/// std::weak_ptr before 2.13, c10::weak_intrusive_ptr since.
using WeakNodePtr = std::conditional_t<
    std::is_same_v<ckpt::compat::NodePtr, std::shared_ptr<torch::autograd::Node>>,
    std::weak_ptr<torch::autograd::Node>, c10::weak_intrusive_ptr<torch::autograd::Node>>;

/// Gives a leaf a post-accumulate-grad hook that receives the leaf once its `.grad` is updated,
/// the C++ side of Python's `register_post_accumulate_grad_hook` (replacing any hook it had).
/// Returns false, and does nothing, where this LibTorch has no such hooks (before 2.1).
inline bool set_post_accumulate_grad_hook(const at::Tensor& leaf,
                                          std::function<void(const at::Tensor&)> hook) {
#if CKPT_TORCH_AT_LEAST(2, 1)
  struct FunctionHook final : torch::autograd::PostAccumulateGradHook {
    explicit FunctionHook(std::function<void(const at::Tensor&)> fn) : fn_(std::move(fn)) {}
    void operator()(const torch::autograd::Variable& tensor) override { fn_(tensor); }
    std::function<void(const at::Tensor&)> fn_;
  };
  TORCH_CHECK(leaf.is_leaf() && leaf.requires_grad(),
              "post-accumulate-grad hooks can only be set on leaves that require grad");
  torch::autograd::impl::set_post_acc_grad_hooks(leaf,
                                                 std::make_unique<FunctionHook>(std::move(hook)));
  return true;
#else
  (void)leaf;
  (void)hook;
  return false;
#endif
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
