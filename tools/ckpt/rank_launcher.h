#pragma once

// `ckpt train --ranks N`: the launcher that forks the local ranks, waits for them, and takes them
// down with it: a rank never outlives its launcher (SIGKILL included), and SIGINT, SIGTERM or
// SIGHUP sent to the launcher (or Ctrl-C to the terminal's process group) stop every rank.

#include <chrono>
#include <functional>

namespace ckpt {
namespace cli {

/// Forks `ranks` processes, the r-th running `run_rank(r)` and exiting with what it returns, and
/// waits for them. Once one has failed, the others get `grace` to stop by themselves before they
/// are killed. Returns the first failure's exit code (0 when all succeeded), or 128 + the signal
/// when the launcher was interrupted (then each rank got the signal, and SIGKILL if it had not
/// stopped 5 s later; a second signal sends SIGKILL at once). Call before any LibTorch work: the
/// children start from this process's state, without its threads.
int launch_ranks(int ranks, std::chrono::seconds grace, const std::function<int(int)>& run_rank);

}  // namespace cli
}  // namespace ckpt
