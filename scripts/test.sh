#!/usr/bin/env bash
# The README's test command: installs what is missing, builds, and runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
cd build
OMP_NUM_THREADS=1 ctest --output-on-failure -j "$(nproc)" "$@"
