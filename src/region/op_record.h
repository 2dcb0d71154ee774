#pragma once

// CheckpointOptions::debug: the operators a region's forward and its recompute run, recorded by a
// dispatch mode, and the error that shows both sequences where they part.

#include "autograd/dispatch_mode.h"

#include <string>
#include <vector>

namespace ckpt {
namespace detail {

/// Records the name of every operator call it sees ("aten::addmm", "aten::mul.Tensor").
class RecordingMode : public DispatchMode {
 public:
  explicit RecordingMode(std::vector<std::string>& names) : names_(names) {}
  void dispatch(const c10::OperatorHandle& op, torch::jit::Stack* stack) override;

 private:
  std::vector<std::string>& names_;
};

/// Raises an error showing both sequences side by side around their first difference, when
/// they differ.
void check_same_operators(const std::vector<std::string>& forward,
                          const std::vector<std::string>& recompute);

}  // namespace detail
}  // namespace ckpt
