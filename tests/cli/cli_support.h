#pragma once

// Running the built `ckpt` program from a GoogleTest program: its exit code, its stdout, and its
// stderr kept in a file named after the test. Needs CKPT_CLI_BINARY and CKPT_TEST_WORK_DIR.

#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace ckpt_cli_test {

struct Result {
  int code = -1;
  std::string out;
  std::string err;
};

// A file in a folder of the running test's own: ctest runs tests in parallel, each in its own
// process, so two tests writing a file of the same name would read each other's half-written file.
inline std::string work_path(const std::string& name) {
  std::string folder = CKPT_TEST_WORK_DIR;
  if (const auto* test = ::testing::UnitTest::GetInstance()->current_test_info()) {
    folder += "/work/" + std::string(test->test_suite_name()) + "." + test->name();
  }
  std::filesystem::create_directories(folder);
  return folder + "/" + name;
}

inline std::string read_text(const std::string& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

// Runs a shell command that sends its stderr to `err_path`.
inline Result run_shell(const std::string& command, const std::string& err_path) {
  Result result;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  size_t n = 0;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) result.out.append(buffer, n);
  const int status = pclose(pipe);
  result.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  result.err = read_text(err_path);
  return result;
}

// Runs `ckpt ARGS` (through sh; `prefix` goes before the binary, e.g. a timeout command).
inline Result run(const std::string& args, const std::string& prefix = "") {
  const std::string err_path = work_path("stderr");
  return run_shell(
      "OMP_NUM_THREADS=1 " + prefix + " " + CKPT_CLI_BINARY + " " + args + " 2>" + err_path,
      err_path);
}

}  // namespace ckpt_cli_test
