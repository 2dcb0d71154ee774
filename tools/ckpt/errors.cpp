#include "errors.h"

#include <cstdlib>
#include <iostream>

namespace ckpt {
namespace cli {
namespace {

bool continuation_byte(char c) {
  return (static_cast<unsigned char>(c) & 0xC0) == 0x80;
}

}  // namespace

std::string error_line(const std::string& message) {
  std::string line;
  for (const char c : message) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '\n') {
      line += "\\n";
    } else if (c == '\t') {
      line += "\\t";
    } else if (byte < 0x20 || byte == 0x7F) {
      static const char kHex[] = "0123456789abcdef";
      line += std::string("\\x") + kHex[byte >> 4] + kHex[byte & 15];
    } else {
      line += c;
    }
  }
  if (line.size() <= kMaxErrorBytes) return line;
  constexpr size_t kHead = kMaxErrorBytes * 3 / 5;
  constexpr size_t kTail = kMaxErrorBytes / 4;
  size_t head = kHead;
  while (head > 0 && continuation_byte(line[head])) --head;
  size_t tail = line.size() - kTail;
  while (tail < line.size() && continuation_byte(line[tail])) ++tail;
  return line.substr(0, head) + " [... " + std::to_string(tail - head) + " bytes left out ...] " +
         line.substr(tail);
}

int report_error(const std::string& message, int code) {
  std::cerr << "ckpt: error: " << error_line(message) << std::endl;
  return code;
}

int report_torch_error(const std::string& what, const std::string& what_without_backtrace,
                       const std::string& prefix) {
  const char* show = std::getenv("TORCH_SHOW_CPP_STACKTRACES");
  if (show != nullptr && std::string(show) == "1") {
    std::cerr << "ckpt: error: " << prefix << what << std::endl;
    return kExitFailure;
  }
  return report_error(prefix + what_without_backtrace.substr(0, what_without_backtrace.find('\n')),
                      kExitFailure);
}

}  // namespace cli
}  // namespace ckpt
