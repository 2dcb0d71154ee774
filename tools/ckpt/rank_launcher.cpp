#include "rank_launcher.h"

#include "errors.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace ckpt {
namespace cli {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGHUP};
constexpr size_t kStopSignalCount = sizeof kStopSignals / sizeof kStopSignals[0];
// How long ranks that got a stop signal have before SIGKILL.
constexpr std::chrono::seconds kStopGrace(5);

volatile std::sig_atomic_t g_signal = 0;   // the last stop signal the launcher got
volatile std::sig_atomic_t g_signals = 0;  // how many

extern "C" void on_stop_signal(int signal) {
  g_signal = signal;
  g_signals = g_signals + 1;
}

std::string signal_name(int signal) {
  switch (signal) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    case SIGHUP:
      return "SIGHUP";
    default:
      return "signal " + std::to_string(signal);
  }
}

sigset_t stop_signal_set() {
  sigset_t set;
  sigemptyset(&set);
  for (const int signal : kStopSignals) sigaddset(&set, signal);
  return set;
}

// The launcher catches the stop signals while its ranks run; the program's own handling comes
// back after. They are blocked while the ranks are forked, so that none runs the launcher's
// handler in a child before the child has set its own.
class StopSignals {
 public:
  StopSignals() {
    g_signal = 0;
    g_signals = 0;
    const sigset_t set = stop_signal_set();
    sigprocmask(SIG_BLOCK, &set, &mask_);
    struct sigaction action {};
    action.sa_handler = on_stop_signal;
    sigemptyset(&action.sa_mask);
    for (size_t i = 0; i < kStopSignalCount; ++i) {
      sigaction(kStopSignals[i], &action, &previous_[i]);
    }
  }
  ~StopSignals() {
    for (size_t i = 0; i < kStopSignalCount; ++i) {
      sigaction(kStopSignals[i], &previous_[i], nullptr);
    }
    sigprocmask(SIG_SETMASK, &mask_, nullptr);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // After the forks: signals reach the launcher's handler.
  void deliver() const { sigprocmask(SIG_SETMASK, &mask_, nullptr); }

 private:
  sigset_t mask_{};
  struct sigaction previous_[kStopSignalCount] {};
};

// A rank ends with its launcher, however the launcher ends (SIGKILL included: the kernel sends
// this process SIGKILL then), and by the stop signals' default action.
[[noreturn]] void run_child(int rank, pid_t launcher, const std::function<int(int)>& run_rank) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != launcher) _exit(kExitFailure);  // the launcher ended before prctl
  for (const int signal : kStopSignals) std::signal(signal, SIG_DFL);
  const sigset_t set = stop_signal_set();
  sigprocmask(SIG_UNBLOCK, &set, nullptr);
  const int code = run_rank(rank);
  std::fflush(nullptr);
  _exit(code);  // the backends' threads are not joined; the process ends here
}

void kill_all(const std::vector<pid_t>& children, int signal) {
  for (const pid_t child : children) kill(child, signal);
}

// Waits for the ranks. Once one has failed, the others get `grace` to stop by themselves; a stop
// signal is passed on to them, and SIGKILL follows kStopGrace later or at a second signal.
int wait_for_ranks(std::vector<pid_t> children, std::chrono::seconds grace) {
  const size_t ranks = children.size();
  int result = kExitOk;
  std::vector<std::string> killed;  // reported at the end, unless the launcher was interrupted
  std::optional<Clock::time_point> first_failure, stopping;
  int signals_passed_on = 0;
  bool forced = false;
  while (!children.empty()) {
    for (const pid_t child : std::vector<pid_t>(children)) {
      int status = 0;
      if (waitpid(child, &status, WNOHANG) != child) continue;
      children.erase(std::find(children.begin(), children.end(), child));
      const int code = WIFEXITED(status) ? WEXITSTATUS(status) : kExitFailure;
      if (WIFSIGNALED(status)) {
        killed.push_back("a rank (process " + std::to_string(child) + ") was killed by signal " +
                         std::to_string(WTERMSIG(status)));
      }
      if (code != kExitOk && result == kExitOk) result = code;
      if (code != kExitOk && !first_failure) first_failure = Clock::now();
    }
    const Clock::time_point now = Clock::now();
    if (g_signals > signals_passed_on) {
      signals_passed_on = g_signals;
      kill_all(children, stopping ? SIGKILL : static_cast<int>(g_signal));
      if (!stopping) stopping = now;
    }
    const bool overdue = (stopping && now - *stopping > kStopGrace) ||
                         (first_failure && !stopping && now - *first_failure > grace);
    if (overdue && !forced && !children.empty()) {
      forced = true;
      kill_all(children, SIGKILL);
      if (!stopping) {
        report_error(
            std::to_string(children.size()) + " rank(s) did not stop after another failed; killed",
            kExitFailure);
      }
    }
    if (!children.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (stopping) {
    std::fprintf(stderr,
                 "ckpt: interrupted by %s: stopped the %zu ranks before the end (no "
                 "summary, no --json file)\n",
                 signal_name(g_signal).c_str(), ranks);
    return 128 + static_cast<int>(g_signal);
  }
  for (const std::string& message : killed) report_error(message, kExitFailure);
  return result;
}

}  // namespace

int launch_ranks(int ranks, std::chrono::seconds grace, const std::function<int(int)>& run_rank) {
  std::fflush(nullptr);
  StopSignals signals;
  const pid_t launcher = getpid();
  std::vector<pid_t> children;
  for (int rank = 0; rank < ranks; ++rank) {
    const pid_t pid = fork();
    if (pid == 0) run_child(rank, launcher, run_rank);
    if (pid < 0) {
      kill_all(children, SIGKILL);
      for (const pid_t child : children) waitpid(child, nullptr, 0);
      throw std::runtime_error("cannot start rank " + std::to_string(rank) + " (fork failed)");
    }
    children.push_back(pid);
  }
  signals.deliver();
  return wait_for_ranks(children, grace);
}

}  // namespace cli
}  // namespace ckpt
