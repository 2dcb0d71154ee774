// The one median of the program and the benchmarks (models/statistics.h).

#include <gtest/gtest.h>

#include "statistics.h"

#include <vector>

namespace ckpt {
namespace models {
namespace statistics_test {

TEST(Statistics, MedianIsTheMiddleOrTheMeanOfTheTwoMiddles) {
  EXPECT_DOUBLE_EQ(median({}), 0.0);
  EXPECT_DOUBLE_EQ(median({7.0}), 7.0);
  EXPECT_DOUBLE_EQ(median({9.0, 1.0, 5.0}), 5.0);  // unsorted
  EXPECT_DOUBLE_EQ(median({4.0, 1.0, 3.0, 2.0}), 2.5);
}

TEST(Statistics, QuantilesInterpolateBetweenOrderStatistics) {
  const std::vector<double> values{40.0, 10.0, 30.0, 20.0, 50.0};
  EXPECT_DOUBLE_EQ(quantile(values, 0.0), 10.0);
  EXPECT_DOUBLE_EQ(quantile(values, 1.0), 50.0);
  EXPECT_DOUBLE_EQ(quantile(values, 0.25), 20.0);
  EXPECT_DOUBLE_EQ(quantile(values, 0.1), 14.0);
  EXPECT_DOUBLE_EQ(quantile({}, 0.5), 0.0);
}

}  // namespace statistics_test
}  // namespace models
}  // namespace ckpt
