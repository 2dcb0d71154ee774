#pragma once

// Byte sizes as people write them: "1048576", "512MiB", "1.5GB".

#include <cstdint>
#include <string>

namespace ckpt {
namespace plan {

/// The largest size parse_bytes accepts: 9 EB (9 * 10^18 bytes, just below 2^63).
constexpr int64_t kMaxParsedBytes = 9'000'000'000'000'000'000;

/// Parses a byte count: a plain integer ("1048576", read exactly) or a number with a unit,
/// decimal (kB, MB, GB, TB: powers of 1000) or binary (KiB, MiB, GiB, TiB: powers of 1024), "B"
/// allowed, case of the unit letters ignored, e.g. "512MiB", "1.5GB", "64 kB". Throws
/// std::invalid_argument naming `what` (where the text came from) when the text is not such a
/// size, the value is not positive, or it is above kMaxParsedBytes ("too large"); the message
/// quotes at most the first 60 characters of the text (quote_excerpt).
int64_t parse_bytes(const std::string& text, const std::string& what);

}  // namespace plan
}  // namespace ckpt
