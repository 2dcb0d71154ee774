#include <stdexcept>
#include <string>

#include "ckpt/plan/solvers.h"

namespace ckpt {
namespace plan {

Schedule solve_uniform(const Chain& chain, int segments) {
  chain.validate();
  const int length = chain.size();
  if (segments < 1 || segments > length) {
    throw std::invalid_argument(
        "ckpt::plan::solve_uniform: segments must be between 1 and the number of stages (" +
        std::to_string(length) + "), but got " + std::to_string(segments) +
        ". Pass fewer segments, or split the model into more stages.");
  }
  // Same segmentation as torch.utils.checkpoint.checkpoint_sequential: segments - 1
  // checkpointed segments of length / segments stages, then the rest runs normally.
  const int size = length / segments;
  const int last_start = (segments - 1) * size;
  Schedule schedule;
  auto& ops = schedule.ops;
  for (int start = 0; start < last_start; start += size) {
    ops.push_back({OpKind::ForwardInput, start, 0});
    for (int i = start + 1; i < start + size; ++i) ops.push_back({OpKind::ForwardNone, i, 0});
  }
  for (int i = last_start; i < length; ++i) ops.push_back({OpKind::ForwardAll, i, 0});
  ops.push_back({OpKind::Loss, length, 0});
  for (int i = length - 1; i >= last_start; --i) ops.push_back({OpKind::Backward, i, 0});
  for (int start = last_start - size; start >= 0; start -= size) {
    for (int i = start; i < start + size; ++i) ops.push_back({OpKind::ForwardAll, i, 0});
    for (int i = start + size - 1; i >= start; --i) ops.push_back({OpKind::Backward, i, 0});
  }
  return schedule;
}

}  // namespace plan
}  // namespace ckpt
