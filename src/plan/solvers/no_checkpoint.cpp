#include "ckpt/plan/solvers.h"

namespace ckpt {
namespace plan {

Schedule solve_no_checkpoint(const Chain& chain) {
  chain.validate();
  const int length = chain.size();
  Schedule schedule;
  schedule.ops.reserve(static_cast<size_t>(2 * length + 1));
  for (int i = 0; i < length; ++i) schedule.ops.push_back({OpKind::ForwardAll, i, 0});
  schedule.ops.push_back({OpKind::Loss, length, 0});
  for (int i = length - 1; i >= 0; --i) schedule.ops.push_back({OpKind::Backward, i, 0});
  return schedule;
}

}  // namespace plan
}  // namespace ckpt
