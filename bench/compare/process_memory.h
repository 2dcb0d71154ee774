#pragma once

// Process-level helpers of the comparison harness: the RSS high-water mark (Linux /proc), the
// glibc mmap threshold, and running the Python twin as a subprocess.

#include <cstdint>
#include <string>

namespace ckpt {
namespace bench {

/// Resets the RSS high-water mark (VmHWM) by writing "5" to /proc/self/clear_refs. Returns
/// false where that is not possible (not Linux, or no permission).
bool reset_rss_peak();

/// VmRSS of this process in bytes, or -1.
int64_t rss_bytes();

/// VmHWM of this process in bytes, or -1.
int64_t rss_peak_bytes();

/// Makes glibc serve every allocation of 64 KiB or more with mmap and return it to the system
/// when freed (mallopt(M_MMAP_THRESHOLD, 65536), as MALLOC_MMAP_THRESHOLD_=65536 does for the
/// Python run), so that RSS follows the live tensors. No-op elsewhere.
void use_small_mmap_threshold();

/// Undoes `use_small_mmap_threshold` for timing: allocations up to 32 MiB come from the heap, and
/// the heap is trimmed only above 64 MiB free (glibc's dynamic threshold would settle there for
/// these models; mmap + page faults per tensor would otherwise dominate small steps).
void use_large_mmap_threshold();

bool file_exists(const std::string& path);

/// The folder of the running program ("" where /proc/self/exe can't be read).
std::string executable_dir();

/// Runs `command` through the shell, collecting its stdout (stderr passes through). Returns the
/// exit status, or -1 when it cannot be started.
int run_command(const std::string& command, std::string& output);

}  // namespace bench
}  // namespace ckpt
