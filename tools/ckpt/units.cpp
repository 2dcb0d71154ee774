#include "units.h"

#include "errors.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>

namespace ckpt {
namespace cli {
std::string format_bytes(int64_t bytes) {
  char buffer[64];
  const double value = static_cast<double>(bytes);
  const double magnitude = std::fabs(value);
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  if (magnitude < 1024) {
    std::snprintf(buffer, sizeof buffer, "%lld B", static_cast<long long>(bytes));
    return buffer;
  }
  double scaled = value / 1024;
  int unit = 0;
  while (std::fabs(scaled) >= 1024 && unit < 3) {
    scaled /= 1024;
    ++unit;
  }
  const double scaled_magnitude = std::fabs(scaled);
  std::snprintf(
      buffer, sizeof buffer,
      scaled_magnitude < 10 ? "%.2f %s" : (scaled_magnitude < 100 ? "%.1f %s" : "%.0f %s"), scaled,
      units[unit]);
  return buffer;
}

std::string format_seconds(double seconds) {
  char buffer[64];
  if (!std::isfinite(seconds)) return "inf";
  const double magnitude = std::fabs(seconds);
  if (magnitude < 1e-3) {
    std::snprintf(buffer, sizeof buffer, "%.0f us", seconds * 1e6);
  } else if (magnitude < 1) {
    std::snprintf(buffer, sizeof buffer, magnitude < 0.1 ? "%.2f ms" : "%.1f ms", seconds * 1e3);
  } else {
    std::snprintf(buffer, sizeof buffer, "%.3g s", seconds);
  }
  return buffer;
}

int64_t parse_positive_int(const std::string& text, const std::string& what) {
  const auto begin = text.find_first_not_of(" \t");
  const auto end = text.find_last_not_of(" \t");
  const std::string trimmed = begin == std::string::npos ? "" : text.substr(begin, end - begin + 1);
  bool digits = !trimmed.empty() && trimmed.size() < 19;
  for (char c : trimmed) digits = digits && std::isdigit(static_cast<unsigned char>(c));
  const int64_t value = digits ? std::stoll(trimmed) : 0;
  if (value < 1) {
    throw UsageError(what + " must be a positive integer, but got '" + text + "'");
  }
  return value;
}

}  // namespace cli
}  // namespace ckpt
