#include <ckpt/plan/bytes.h>
#include <ckpt/plan/excerpt.h>

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <stdexcept>

namespace ckpt {
namespace plan {
namespace {

std::string lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

std::string trim(const std::string& text) {
  const auto begin = text.find_first_not_of(" \t");
  if (begin == std::string::npos) return "";
  const auto end = text.find_last_not_of(" \t");
  return text.substr(begin, end - begin + 1);
}

// Bytes per unit, or 0 for an unknown unit.
double unit_scale(const std::string& unit) {
  if (unit.empty() || unit == "b") return 1;
  if (unit == "k" || unit == "kb") return 1e3;
  if (unit == "m" || unit == "mb") return 1e6;
  if (unit == "g" || unit == "gb") return 1e9;
  if (unit == "t" || unit == "tb") return 1e12;
  if (unit == "kib") return 1024.0;
  if (unit == "mib") return 1024.0 * 1024;
  if (unit == "gib") return 1024.0 * 1024 * 1024;
  if (unit == "tib") return 1024.0 * 1024 * 1024 * 1024;
  return 0;
}

}  // namespace

int64_t parse_bytes(const std::string& text, const std::string& what) {
  const std::string trimmed = trim(text);
  const auto bad = [&]() {
    return std::invalid_argument(what + " must be a positive size in bytes, such as 1048576, " +
                                 "512MiB or 1.5GB, but got " + quote_excerpt(text));
  };
  const auto too_large = [&]() {
    return std::invalid_argument(what + " is too large: at most " +
                                 std::to_string(kMaxParsedBytes) + " bytes (9 EB), but got " +
                                 quote_excerpt(text));
  };
  size_t number_end = 0;
  while (number_end < trimmed.size() &&
         (std::isdigit(static_cast<unsigned char>(trimmed[number_end])) ||
          trimmed[number_end] == '.')) {
    ++number_end;
  }
  if (number_end == 0) throw bad();
  const std::string number = trimmed.substr(0, number_end);
  if (number.find('.') != number.rfind('.') || number == ".") throw bad();
  const std::string unit = lower(trim(trimmed.substr(number_end)));
  const double scale = unit_scale(unit);
  if (scale == 0) {
    throw std::invalid_argument(what + ": unknown unit " + quote_excerpt(unit) + " in " +
                                quote_excerpt(text) +
                                "; use B, kB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, "
                                "TiB (powers of 1024)");
  }
  const bool integer = number.find('.') == std::string::npos;
  if (unit.empty() && !integer) throw bad();
  if (integer && scale == 1) {  // exact, where a double would round past 2^53
    int64_t value = 0;
    const auto [end, error] = std::from_chars(number.data(), number.data() + number.size(), value);
    if (error == std::errc::result_out_of_range ||
        (error == std::errc() && value > kMaxParsedBytes)) {
      throw too_large();
    }
    if (error != std::errc() || end != number.data() + number.size() || value < 1) throw bad();
    return value;
  }
  // strtod, not stod: a number beyond double's range is +inf here (refused below), not a throw.
  const double value = std::strtod(number.c_str(), nullptr) * scale;
  if (!(value >= 1)) throw bad();
  if (!(value <= static_cast<double>(kMaxParsedBytes))) throw too_large();
  return static_cast<int64_t>(std::llround(value));
}

}  // namespace plan
}  // namespace ckpt
