#pragma once

// Counts how often a device's kernels of some operators run: what the device computes, as opposed
// to the operator calls autograd and ckpt's dispatch mode see (a selective region's recompute
// calls a kept operator, but its kernel does not run).

#include <c10/core/DeviceType.h>
#include <torch/library.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

namespace ckpt {
namespace test {

class KernelCounter {
 public:
  /// While it lives, the kernels of `ops` ("aten::addmm", ...) for `type`'s dispatch key count
  /// their calls before they run. Raises an error where this LibTorch can't wrap them.
  KernelCounter(c10::DeviceType type, const std::vector<std::string>& ops);
  ~KernelCounter();
  KernelCounter(const KernelCounter&) = delete;
  KernelCounter& operator=(const KernelCounter&) = delete;

  /// Calls counted so far, of all the operators together.
  int64_t calls() const;

  /// Whether counters can wrap the kernels of `type` with this LibTorch.
  static bool available(c10::DeviceType type);

 private:
  std::unique_ptr<torch::Library> library_;
};

}  // namespace test
}  // namespace ckpt
