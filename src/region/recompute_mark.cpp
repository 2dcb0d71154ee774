#include "recompute_mark.h"

#include <ckpt/recompute.h>

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

}  // namespace detail

bool is_recomputing() {
  return detail::recompute_depth > 0;
}

}  // namespace ckpt
