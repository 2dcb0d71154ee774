#include <ckpt/plan/bytes.h>

#include <cctype>
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

}  // namespace

int64_t parse_bytes(const std::string& text, const std::string& what) {
  const std::string trimmed = trim(text);
  const auto bad = [&]() {
    return std::invalid_argument(what + " must be a positive size in bytes, such as 1048576, " +
                                 "512MiB or 1.5GB, but got '" + text + "'");
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
  double scale = 0;
  if (unit.empty() || unit == "b") {
    scale = 1;
  } else if (unit == "k" || unit == "kb") {
    scale = 1e3;
  } else if (unit == "m" || unit == "mb") {
    scale = 1e6;
  } else if (unit == "g" || unit == "gb") {
    scale = 1e9;
  } else if (unit == "t" || unit == "tb") {
    scale = 1e12;
  } else if (unit == "kib") {
    scale = 1024.0;
  } else if (unit == "mib") {
    scale = 1024.0 * 1024;
  } else if (unit == "gib") {
    scale = 1024.0 * 1024 * 1024;
  } else if (unit == "tib") {
    scale = 1024.0 * 1024 * 1024 * 1024;
  } else {
    throw std::invalid_argument(what + ": unknown unit '" + unit + "' in '" + text +
                                "'; use B, kB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, "
                                "TiB (powers of 1024)");
  }
  if (unit.empty() && number.find('.') != std::string::npos) throw bad();
  // strtod, not stod: a number beyond double's range is +inf here (refused below), not a throw.
  const double value = std::strtod(number.c_str(), nullptr) * scale;
  if (!(value >= 1) || value > 9.0e18) throw bad();
  return static_cast<int64_t>(std::llround(value));
}

}  // namespace plan
}  // namespace ckpt
