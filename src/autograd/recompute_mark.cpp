#include "recompute_mark.h"

namespace ckpt {
namespace detail {
namespace {
thread_local int recompute_depth = 0;
}  // namespace

RecomputeMark::RecomputeMark() {
  ++recompute_depth;
}
RecomputeMark::~RecomputeMark() {
  --recompute_depth;
}

bool recomputing() {
  return recompute_depth > 0;
}

}  // namespace detail
}  // namespace ckpt
