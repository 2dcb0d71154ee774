#pragma once

// Text from outside (a command-line value, a JSON key or value) quoted in an error message, with
// its length bounded: a 20 MB value must not become a 20 MB line.

#include <cstddef>
#include <string>
#include <string_view>

namespace ckpt {
namespace plan {

/// `text` in double quotes for an error message: whole when it holds at most `limit` bytes, else
/// its first bytes (never half a UTF-8 character), "..." and its length ("\"AAAA...\" (20000000
/// bytes)"). Control bytes (NUL, newlines) appear as \xNN, so that the message stays one line.
std::string quote_excerpt(std::string_view text, size_t limit = 60);

}  // namespace plan
}  // namespace ckpt
