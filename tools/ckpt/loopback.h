#pragma once

// A free port on the loopback, for ranks that meet there: the launcher of `ckpt train --ranks N`
// and the tests that start ranks of their own.

namespace ckpt {
namespace cli {

/// A TCP port of 127.0.0.1 that nobody listened on a moment ago (the kernel's pick). Throws
/// std::runtime_error when there is none.
int free_loopback_port();

}  // namespace cli
}  // namespace ckpt
