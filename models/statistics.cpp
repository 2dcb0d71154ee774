#include "statistics.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <utility>

namespace ckpt {
namespace models {

double quantile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double position = q * static_cast<double>(values.size() - 1);
  const auto below = static_cast<size_t>(std::floor(position));
  const size_t above = std::min(below + 1, values.size() - 1);
  return values[below] + (position - static_cast<double>(below)) * (values[above] - values[below]);
}

double median(std::vector<double> values) {
  return quantile(std::move(values), 0.5);
}

}  // namespace models
}  // namespace ckpt
