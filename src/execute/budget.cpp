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
  return Budget(Kind::Bytes, static_cast<double>(value));
}

Budget Budget::fraction(double value) {
  TORCH_CHECK(value > 0 && value <= 1,
              "ckpt::Budget::fraction: the fraction of the no-checkpoint peak must be in (0, 1], "
              "but got ",
              value, ". Pass 0.4 for 40%.");
  return Budget(Kind::Fraction, value);
}

Budget Budget::minimum() {
  return Budget(Kind::Minimum, 0);
}

Budget Budget::parse(const std::string& text) {
  const auto first = text.find_first_not_of(" \t");
  const auto last = text.find_last_not_of(" \t");
  if (last != std::string::npos && text.substr(first, last - first + 1) == "min") return minimum();
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
    TORCH_CHECK(false, error.what(),
                " (or a percentage of the no-checkpoint peak, such as 40%, or \"min\" for the "
                "smallest feasible budget).");
  }
  return bytes(value);
}

int64_t Budget::resolve(int64_t no_checkpoint_peak_bytes, int64_t smallest_feasible_bytes) const {
  switch (kind_) {
    case Kind::Bytes:
      return static_cast<int64_t>(value_);
    case Kind::Fraction:
      return static_cast<int64_t>(
          std::floor(value_ * static_cast<double>(no_checkpoint_peak_bytes)));
    case Kind::Minimum:
      return smallest_feasible_bytes;
  }
  TORCH_INTERNAL_ASSERT(false, "unknown budget kind");
}

InfeasibleBudget::InfeasibleBudget(int64_t budget_bytes, int64_t smallest_feasible_bytes)
    : c10::Error({__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                 c10::str("ckpt::PlannedSequential: no schedule fits in a budget of ", budget_bytes,
                          " bytes; the smallest feasible budget for this chain is ",
                          smallest_feasible_bytes,
                          " bytes. Raise the budget, ask for it with Budget::minimum() (\"min\"), "
                          "or set PlannedOptions().fall_back_to_minimum(true).")),
      smallest_feasible_bytes_(smallest_feasible_bytes) {}

}  // namespace ckpt
