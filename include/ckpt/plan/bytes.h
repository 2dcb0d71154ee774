#pragma once

// Byte sizes as people write them: "1048576", "512MiB", "1.5GB".

#include <cstdint>
#include <string>

namespace ckpt {
namespace plan {

/// Parses a byte count: a plain integer ("1048576") or a number with a unit, decimal (kB, MB,
/// GB, TB: powers of 1000) or binary (KiB, MiB, GiB, TiB: powers of 1024), "B" allowed, case
/// of the unit letters ignored, e.g. "512MiB", "1.5GB", "64 kB". Throws std::invalid_argument
/// naming `what` (where the text came from) when the text is not such a size or the value is
/// not positive.
int64_t parse_bytes(const std::string& text, const std::string& what);

}  // namespace plan
}  // namespace ckpt
