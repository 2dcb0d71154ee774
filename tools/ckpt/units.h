#pragma once

// Byte sizes and durations on the command line: parsing "512MiB", printing "12.3 MiB".

#include <ckpt/plan/bytes.h>

#include <cstdint>
#include <string>

namespace ckpt {
namespace cli {

using plan::parse_bytes;

/// A human-readable size with a binary unit: "512 B", "1.50 KiB", "12.3 MiB", "2.00 GiB".
std::string format_bytes(int64_t bytes);

/// A human-readable duration: "850 us", "12.3 ms", "1.23 s".
std::string format_seconds(double seconds);

/// Parses a positive integer ("4"); throws UsageError naming `what` otherwise.
int64_t parse_positive_int(const std::string& text, const std::string& what);

}  // namespace cli
}  // namespace ckpt
