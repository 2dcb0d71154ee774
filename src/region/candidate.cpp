#include <ckpt/candidate.h>

namespace ckpt {
namespace detail {
namespace {
thread_local CandidateRunner* current_runner = nullptr;
}  // namespace

CandidateRunner* candidate_runner() {
  return current_runner;
}

CandidateRunnerScope::CandidateRunnerScope(CandidateRunner* runner) : previous_(current_runner) {
  current_runner = runner;
}

CandidateRunnerScope::~CandidateRunnerScope() {
  current_runner = previous_;
}

}  // namespace detail
}  // namespace ckpt
