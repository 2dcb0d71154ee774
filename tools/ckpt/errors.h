#pragma once

// Error kinds of the program: main() maps them to exit codes (docs/cli.md, "Exit codes").

#include <stdexcept>
#include <string>

namespace ckpt {
namespace cli {

/// A bad command line (an option value out of range, an unknown strategy or solver): exit 2.
struct UsageError : std::invalid_argument {
  explicit UsageError(const std::string& message) : std::invalid_argument(message) {}
};

/// Exit codes.
constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;
constexpr int kExitInterrupted = 130;

}  // namespace cli
}  // namespace ckpt
