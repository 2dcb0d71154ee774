#pragma once

// Output files of the program's options, checked before any work.

#include <string>

namespace ckpt {
namespace cli {

/// Throws UsageError when `path` (the value of `option`) cannot be created or overwritten: its
/// folder is missing or read-only, or it names a folder. Creates nothing; an empty path passes.
void check_output_path(const std::string& path, const std::string& option);

}  // namespace cli
}  // namespace ckpt
