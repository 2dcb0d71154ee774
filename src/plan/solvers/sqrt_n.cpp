#include <algorithm>
#include <cmath>

#include "ckpt/plan/solvers.h"

namespace ckpt {
namespace plan {

Schedule solve_sqrt_n(const Chain& chain) {
  chain.validate();
  const int length = chain.size();
  // Chen et al. 2016, section 4.1: sqrt(n) segments of sqrt(n) stages, each segment's input
  // kept. We use checkpoint_sequential's segmentation with round(sqrt(n)) segments.
  const int segments =
      std::clamp(static_cast<int>(std::lround(std::sqrt(static_cast<double>(length)))), 1, length);
  return solve_uniform(chain, segments);
}

}  // namespace plan
}  // namespace ckpt
