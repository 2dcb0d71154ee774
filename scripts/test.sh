#!/usr/bin/env bash
# The README's test command: installs what is missing, builds, and runs the whole test suite
# against the LibTorch chosen by CKPT_LIBTORCH (default: the `torch` wheel's LibTorch 2.x;
# CKPT_LIBTORCH=debian for Debian's 1.13.1). Extra arguments go to ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
source scripts/libtorch.sh
cd "$CKPT_BUILD_DIR"
OMP_NUM_THREADS=1 ctest --output-on-failure -j "$(nproc)" "$@"
