#pragma once

// Runs the ranks of a test as processes on the loopback: fork, run the rank's body, report.
// The parent process does no LibTorch work, so that each child starts from a clean state (no
// intra-op threads to lose in the fork), and every wait is bounded by a deadline.

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace ckpt {
namespace test {

/// What one rank did.
struct RankOutcome {
  int exit_code = -1;      // the child's exit status; -1 when it ended by a signal
  int signal = 0;          // the signal that ended it, if any
  bool timed_out = false;  // still running at the deadline, then killed
  std::string message;     // what the body threw (empty when it returned)
  double seconds = 0;      // from the start to the child's end
  bool ok() const { return exit_code == 0 && !timed_out; }
};

/// A port that was free a moment ago on 127.0.0.1.
int free_port();

/// Forks `world_size` processes running `body(rank)` and waits for all of them, at most
/// `deadline`; those still running then are killed. A body that throws exits with 1 and its
/// message in `RankOutcome::message`.
std::vector<RankOutcome> run_ranks(int world_size, const std::function<void(int rank)>& body,
                                   std::chrono::seconds deadline);

/// Every rank's outcome, for failure messages.
std::string describe(const std::vector<RankOutcome>& outcomes);

}  // namespace test
}  // namespace ckpt
