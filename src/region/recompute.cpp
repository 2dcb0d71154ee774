#include <ckpt/recompute.h>

#include "autograd/recompute_mark.h"

namespace ckpt {

bool is_recomputing() {
  return detail::recomputing();
}

}  // namespace ckpt
