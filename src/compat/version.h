#pragma once

// The LibTorch version test every compat file uses (src/compat/ is the one place that has them).

#include <torch/version.h>

/// True when the LibTorch being compiled against is at least `major.minor`.
#define CKPT_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||       \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))
