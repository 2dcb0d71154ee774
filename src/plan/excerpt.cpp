#include <ckpt/plan/excerpt.h>

#include <cstdio>

namespace ckpt {
namespace plan {

std::string quote_excerpt(std::string_view text, size_t limit) {
  size_t shown = text.size();
  if (shown > limit) {
    shown = limit;
    // Back to the first byte of a UTF-8 character (continuation bytes are 10xxxxxx).
    while (shown > 0 && (static_cast<unsigned char>(text[shown]) & 0xC0) == 0x80) --shown;
  }
  std::string quoted = "\"";
  for (size_t i = 0; i < shown; ++i) {
    const auto byte = static_cast<unsigned char>(text[i]);
    if (byte < 0x20 || byte == 0x7F) {
      char escaped[5];
      std::snprintf(escaped, sizeof escaped, "\\x%02X", byte);
      quoted += escaped;
    } else {
      quoted += static_cast<char>(byte);
    }
  }
  quoted += shown < text.size() ? "...\"" : "\"";
  if (shown < text.size()) quoted += " (" + std::to_string(text.size()) + " bytes)";
  return quoted;
}

}  // namespace plan
}  // namespace ckpt
