#pragma once

// Error kinds of the program: main() maps them to exit codes (docs/cli.md, "Exit codes"), and
// prints each as one line.

#include <cstddef>
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
constexpr int kExitInterrupted = 130;  // 128 + SIGINT; other signals give 128 + their number

/// The longest error line the program prints, in bytes.
constexpr size_t kMaxErrorBytes = 1000;

/// `message` as one line of at most kMaxErrorBytes: control characters (newlines included) are
/// written as escapes (\n, \x1b), and the middle of a longer message (a huge value it echoes) is
/// left out, keeping its start (what was wrong) and its end (what to do), in whole UTF-8
/// characters.
std::string error_line(const std::string& message);

/// Prints `ckpt: error: <error_line(message)>` on stderr; returns `code`.
int report_error(const std::string& message, int code);

/// Reports a LibTorch error (a c10::Error, given by its what() and what_without_backtrace()),
/// after `prefix`: the first line of its message (what follows is context or a stack trace), or
/// all of what() with TORCH_SHOW_CPP_STACKTRACES=1, LibTorch's switch. Returns kExitFailure.
int report_torch_error(const std::string& what, const std::string& what_without_backtrace,
                       const std::string& prefix = "");

}  // namespace cli
}  // namespace ckpt
