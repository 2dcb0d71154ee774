#pragma once

// Output files of the program's options, checked before any work.

#include <string>

namespace ckpt {
namespace cli {

/// Throws UsageError when `path` (the value of `option`) cannot be created or overwritten: its
/// folder is missing or read-only, or it names a folder. Creates nothing; an empty path passes.
void check_output_path(const std::string& path, const std::string& option);

/// Writes `text` to `path` (the value of `option`) whole or not at all: into a file of its own
/// next to it, renamed over `path` once complete, so that a process killed while writing leaves
/// no truncated file behind; a device or a pipe is written into directly. Throws
/// std::runtime_error naming the option when any of it could not be written (a full disk,
/// /dev/full). Every file the program writes goes through here.
void write_whole_file(const std::string& path, const std::string& text, const std::string& option);

}  // namespace cli
}  // namespace ckpt
