#include "ranks.h"

#include "loopback.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <sstream>
#include <thread>

namespace ckpt {
namespace test {

int free_port() {
  return cli::free_loopback_port();
}

namespace {

std::string message_path(pid_t parent, int rank) {
  return "/tmp/ckpt_ranks_" + std::to_string(parent) + "_" + std::to_string(rank) + ".txt";
}

[[noreturn]] void run_child(const std::function<void(int)>& body, int rank, pid_t parent) {
  int code = 0;
  try {
    body(rank);
  } catch (const std::exception& error) {
    std::ofstream(message_path(parent, rank)) << error.what();
    code = 1;
  } catch (...) {
    std::ofstream(message_path(parent, rank)) << "unknown exception";
    code = 1;
  }
  std::fflush(nullptr);
  // No destructors: the backends' threads would be joined (or not) in a state the test has no
  // say in. The process ends here.
  _exit(code);
}

}  // namespace

std::vector<RankOutcome> run_ranks(int world_size, const std::function<void(int)>& body,
                                   std::chrono::seconds deadline) {
  using Clock = std::chrono::steady_clock;
  const pid_t parent = getpid();
  std::fflush(nullptr);
  const Clock::time_point start = Clock::now();
  std::vector<pid_t> children;
  for (int rank = 0; rank < world_size; ++rank) {
    const pid_t pid = fork();
    if (pid == 0) run_child(body, rank, parent);
    children.push_back(pid);
  }
  std::vector<RankOutcome> outcomes(world_size);
  std::vector<bool> done(world_size, false);
  int running = world_size;
  while (running > 0) {
    for (int rank = 0; rank < world_size; ++rank) {
      if (done[rank]) continue;
      int status = 0;
      if (children[rank] < 0 || waitpid(children[rank], &status, WNOHANG) == children[rank]) {
        done[rank] = true;
        --running;
        RankOutcome& outcome = outcomes[rank];
        outcome.seconds = std::chrono::duration<double>(Clock::now() - start).count();
        if (children[rank] < 0) continue;
        if (WIFEXITED(status)) outcome.exit_code = WEXITSTATUS(status);
        if (WIFSIGNALED(status)) outcome.signal = WTERMSIG(status);
      }
    }
    if (running > 0 && Clock::now() - start > deadline) {
      for (int rank = 0; rank < world_size; ++rank) {
        if (done[rank]) continue;
        kill(children[rank], SIGKILL);
        waitpid(children[rank], nullptr, 0);
        outcomes[rank].timed_out = true;
        outcomes[rank].seconds = std::chrono::duration<double>(Clock::now() - start).count();
        done[rank] = true;
      }
      running = 0;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (int rank = 0; rank < world_size; ++rank) {
    const std::string path = message_path(parent, rank);
    std::ifstream file(path);
    std::stringstream text;
    text << file.rdbuf();
    outcomes[rank].message = text.str();
    std::remove(path.c_str());
  }
  return outcomes;
}

std::string describe(const std::vector<RankOutcome>& outcomes) {
  std::ostringstream text;
  for (size_t rank = 0; rank < outcomes.size(); ++rank) {
    const RankOutcome& outcome = outcomes[rank];
    text << "rank " << rank << ": exit " << outcome.exit_code << ", signal " << outcome.signal
         << (outcome.timed_out ? ", TIMED OUT" : "") << ", " << outcome.seconds << " s";
    if (!outcome.message.empty()) text << ", threw: " << outcome.message;
    text << "\n";
  }
  return text.str();
}

}  // namespace test
}  // namespace ckpt
