#include <ckpt/executor.h>
#include <ckpt/plan/bytes.h>

#include <c10/util/Exception.h>

#include <cmath>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace ckpt {

Budget Budget::bytes(int64_t value) {
  TORCH_CHECK(value > 0, "ckpt::Budget::bytes: the budget must be positive, but got ", value,
              " bytes.");
  return Budget(false, static_cast<double>(value));
}

Budget Budget::fraction(double value) {
  TORCH_CHECK(value > 0 && value <= 1,
              "ckpt::Budget::fraction: the fraction of the no-checkpoint peak must be in (0, 1], "
              "but got ",
              value, ". Pass 0.4 for 40%.");
  return Budget(true, value);
}

Budget Budget::parse(const std::string& text) {
  const auto last = text.find_last_not_of(" \t");
  if (last != std::string::npos && text[last] == '%') {
    char* end = nullptr;
    const double percent = std::strtod(text.c_str(), &end);
    TORCH_CHECK(end != text.c_str() && static_cast<size_t>(end - text.c_str()) == last,
                "ckpt::Budget::parse: cannot read a percentage from \"", text,
                "\". Write it as \"40%\".");
    return fraction(percent / 100.0);
  }
  int64_t value = 0;
  try {
    value = plan::parse_bytes(text, "ckpt::Budget::parse: the budget");
  } catch (const std::invalid_argument& error) {
    TORCH_CHECK(false, error.what(), " (or a percentage of the no-checkpoint peak, such as 40%).");
  }
  return bytes(value);
}

int64_t Budget::resolve(int64_t no_checkpoint_peak_bytes) const {
  if (!is_fraction_) return static_cast<int64_t>(value_);
  return static_cast<int64_t>(std::floor(value_ * static_cast<double>(no_checkpoint_peak_bytes)));
}

}  // namespace ckpt
