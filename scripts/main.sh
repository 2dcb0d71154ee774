#!/usr/bin/env bash
# The README's main command: installs what is missing, builds, and runs `ckpt train` (arguments
# are passed on, e.g. `bash scripts/main.sh --strategy sequential:4`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
OMP_NUM_THREADS=1 ./build/tools/ckpt/ckpt train "$@"
