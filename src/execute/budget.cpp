#include <ckpt/executor.h>

#include <c10/util/Exception.h>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

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
  const char* begin = text.c_str();
  char* end = nullptr;
  const double number = std::strtod(begin, &end);
  std::string unit(end);
  while (!unit.empty() && std::isspace(static_cast<unsigned char>(unit.front()))) unit.erase(0, 1);
  TORCH_CHECK(end != begin && std::isfinite(number),
              "ckpt::Budget::parse: cannot read a budget from \"", text,
              "\". Write bytes (\"1048576\"), with a unit (\"512MB\", \"2GiB\"), or a percentage "
              "of the no-checkpoint peak (\"40%\").");
  if (unit == "%") return fraction(number / 100.0);
  static const std::vector<std::pair<std::string, double>> units = {
      {"", 1},       {"B", 1},         {"KB", 1e3},        {"MB", 1e6},
      {"GB", 1e9},   {"KiB", 1024.0},  {"MiB", 1048576.0}, {"GiB", 1073741824.0},
      {"K", 1024.0}, {"M", 1048576.0}, {"G", 1073741824.0}};
  for (const auto& [name, scale] : units) {
    if (unit == name) return bytes(static_cast<int64_t>(std::llround(number * scale)));
  }
  TORCH_CHECK(false, "ckpt::Budget::parse: unknown unit \"", unit, "\" in \"", text,
              "\". Use B, KB, MB, GB, KiB, MiB, GiB, or % of the no-checkpoint peak.");
}

int64_t Budget::resolve(int64_t no_checkpoint_peak_bytes) const {
  if (!is_fraction_) return static_cast<int64_t>(value_);
  return static_cast<int64_t>(std::floor(value_ * static_cast<double>(no_checkpoint_peak_bytes)));
}

}  // namespace ckpt
