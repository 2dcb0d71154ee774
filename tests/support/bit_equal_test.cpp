// bit_equal compares bits, not values: the tests' "to the bit" means what it says.

#include "support/support.h"

#include <cmath>
#include <cstdint>
#include <string>

namespace ckpt {
namespace test {
namespace {

TEST(BitEqualTest, SignedZerosDifferAndSameNaNsAreEqual) {
  const torch::Tensor zero = torch::tensor({1.0f, 0.0f});
  const torch::Tensor negative_zero = torch::tensor({1.0f, -0.0f});
  ASSERT_TRUE(torch::equal(zero, negative_zero));  // equal values
  EXPECT_FALSE(bit_equal(zero, negative_zero));
  const torch::Tensor nan = torch::tensor({std::nan("")}, torch::kDouble);
  ASSERT_FALSE(torch::equal(nan, nan));  // NaN is no value's equal
  EXPECT_TRUE(bit_equal(nan, nan.clone()));
  // Another NaN, with another payload, is other bits.
  const torch::Tensor other_nan = (nan.view(torch::kInt64) + 1).view(torch::kDouble);
  ASSERT_TRUE(std::isnan(other_nan.item<double>()));
  EXPECT_FALSE(bit_equal(nan, other_nan));
}

TEST(BitEqualTest, EveryDtypeAndLayout) {
  for (const auto dtype :
       {torch::kFloat, torch::kDouble, torch::kHalf, torch::kBFloat16, torch::kInt64, torch::kInt8,
        torch::kBool, torch::kComplexFloat, torch::kComplexDouble}) {
    const torch::Tensor a = torch::arange(6).reshape({2, 3}).to(dtype);
    EXPECT_TRUE(bit_equal(a.t(), a.t().contiguous())) << dtype;  // strides do not matter
    EXPECT_FALSE(bit_equal(a, a.to(dtype == torch::kLong ? torch::kInt : torch::kLong))) << dtype;
  }
  EXPECT_TRUE(bit_equal(torch::tensor(2.5), torch::tensor(2.5)));  // zero dimensions
  EXPECT_TRUE(bit_equal(torch::empty({0, 3}), torch::empty({0, 3})));
  EXPECT_FALSE(bit_equal(torch::zeros({2}), torch::zeros({1, 2})));
  EXPECT_TRUE(bit_equal(torch::ones({2}, torch::requires_grad()), torch::ones({2})));
  const torch::Tensor c = torch::complex(torch::ones({2}), torch::ones({2}));
  EXPECT_FALSE(bit_equal(c, c.conj()));  // the lazy conjugate's bits, resolved
}

TEST(BitEqualTest, SaysWhereTheBitsDiffer) {
  const torch::Tensor a = torch::tensor({1.0f, 2.0f, 3.0f, 4.0f});
  const torch::Tensor b = torch::tensor({1.0f, 2.0f, std::nextafter(3.0f, 4.0f), -4.0f});
  const std::string message = bit_equal(a, b).message();
  EXPECT_NE(message.find("2 of 4 values differ in their bits; the first at flat index 2"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("max abs difference 8"), std::string::npos) << message;
}

}  // namespace
}  // namespace test
}  // namespace ckpt
