#include "output_path.h"

#include "errors.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <system_error>

#include <fcntl.h>
#include <unistd.h>

namespace ckpt {
namespace cli {

namespace fs = std::filesystem;

namespace {

// Where `path` is written before it is renamed into place.
std::string partial_path(const std::string& path) {
  return path + ".partial-" + std::to_string(getpid());
}

}  // namespace

void check_output_path(const std::string& path, const std::string& option) {
  if (path.empty()) return;
  const fs::path file(path);
  std::error_code error;
  if (fs::is_directory(file, error)) {
    throw UsageError(option + ": '" + path + "' is a folder; give a file name");
  }
  const fs::path folder = file.has_parent_path() ? file.parent_path() : fs::path(".");
  if (!fs::is_directory(folder, error)) {
    throw UsageError(option + ": the folder '" + folder.string() + "' of '" + path +
                     "' does not exist");
  }
  const bool exists = fs::exists(file, error);
  if (access((exists ? file : folder).c_str(), W_OK) != 0) {
    throw UsageError(option + ": '" + (exists ? path : folder.string()) + "' is not writable");
  }
  // A regular file is written beside itself and renamed over (write_whole_file): make sure a file
  // can be made there, which permissions alone don't tell (/proc, a read-only mount, as root).
  if (exists && !fs::is_regular_file(file, error)) return;
  const std::string probe = partial_path(path);
  const int fd = open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
  if (fd < 0) {
    throw UsageError(option + ": cannot make a file in '" + folder.string() + "' to write '" +
                     path + "'");
  }
  close(fd);
  std::remove(probe.c_str());
}

namespace {

// Writes `text` into the open `file` and closes it: false when any of it did not reach the file
// (a full disk, /dev/full: a buffered stream fails only when it flushes).
bool write_and_close(std::ofstream& file, const std::string& text) {
  const bool written = static_cast<bool>(file << text) && static_cast<bool>(file.flush());
  file.close();
  return written && !file.fail();
}

}  // namespace

void write_whole_file(const std::string& path, const std::string& text, const std::string& option) {
  const std::string failed = option + ": cannot write '" + path + "'";
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  if (fs::exists(status) && !fs::is_regular_file(status)) {
    // A device or a pipe (/dev/stdout, a FIFO): there is nothing to rename over; write into it.
    std::ofstream file(path, std::ios::binary);
    if (!file || !write_and_close(file, text)) throw std::runtime_error(failed);
    return;
  }
  const std::string partial = partial_path(path);
  std::ofstream file(partial, std::ios::binary);
  const bool written = file && write_and_close(file, text);
  if (!written || std::rename(partial.c_str(), path.c_str()) != 0) {
    std::remove(partial.c_str());
    throw std::runtime_error(failed);
  }
}

}  // namespace cli
}  // namespace ckpt
