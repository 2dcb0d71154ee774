#include "process_memory.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#if defined(__GLIBC__)
#include <malloc.h>
#endif
#if defined(__unix__)
#include <sys/wait.h>
#endif

namespace ckpt {
namespace bench {
namespace {

int64_t status_field_bytes(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.compare(0, field.size() + 1, field + ":") == 0) {
      std::istringstream in(line.substr(field.size() + 1));
      int64_t kib = -1;
      in >> kib;
      return kib < 0 ? -1 : kib * 1024;
    }
  }
  return -1;
}

}  // namespace

bool reset_rss_peak() {
  std::ofstream clear("/proc/self/clear_refs");
  if (!clear) return false;
  clear << "5";
  clear.flush();
  return static_cast<bool>(clear);
}

int64_t rss_bytes() {
  return status_field_bytes("VmRSS");
}

int64_t rss_peak_bytes() {
  return status_field_bytes("VmHWM");
}

void use_small_mmap_threshold() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_THRESHOLD, 65536);
  mallopt(M_TRIM_THRESHOLD, 128 * 1024);
  malloc_trim(0);  // give back what the heap kept during a timing phase, or RSS would not grow
#endif
}

void use_large_mmap_threshold() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 64 << 20);
#endif
}

bool file_exists(const std::string& path) {
  return static_cast<bool>(std::ifstream(path));
}

std::string executable_dir() {
  std::error_code error;
  const auto path = std::filesystem::read_symlink("/proc/self/exe", error);
  return error ? std::string() : path.parent_path().string();
}

int run_command(const std::string& command, std::string& output) {
#if defined(__unix__)
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return -1;
  char buffer[4096];
  size_t read = 0;
  while ((read = fread(buffer, 1, sizeof buffer, pipe)) > 0) output.append(buffer, read);
  const int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
#else
  (void)command;
  (void)output;
  return -1;
#endif
}

}  // namespace bench
}  // namespace ckpt
