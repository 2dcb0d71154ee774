#!/usr/bin/env bash
# The README's main command: installs what is missing, builds, and runs the main job.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
OMP_NUM_THREADS=1 ./build/examples/compare/ckpt_compare "$@"
