#!/usr/bin/env bash
# The README's main command: installs what is missing, builds the `ckpt` program (only it and the
# libraries it links, not the test suite), and runs `ckpt train` (arguments are passed on, e.g.
# `bash scripts/main.sh --strategy sequential:4`). CKPT_LIBTORCH=debian builds against Debian's
# LibTorch 1.13 instead of the `torch` wheel's 2.x.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh --target ckpt_cli
source scripts/libtorch.sh
OMP_NUM_THREADS=1 "./$CKPT_BUILD_DIR/tools/ckpt/ckpt" train "$@"
