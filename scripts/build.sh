#!/usr/bin/env bash
# Configures and builds ckpt (Release, Ninja) against the LibTorch chosen by CKPT_LIBTORCH
# (scripts/libtorch.sh): build/ for the wheel's LibTorch 2.x, build-debian/ for Debian's 1.13.
# usage: build.sh [--target NAME]... [CMAKE_ARGS...]
# Without --target it builds everything (the test suite included); with it, only those targets
# and what they link. The other arguments go to CMake.
set -euo pipefail
cd "$(dirname "$0")/.."
targets=()
while [ $# -gt 0 ] && [ "$1" = --target ]; do
  [ $# -ge 2 ] || { echo "ckpt: build.sh: --target needs a target name" >&2; exit 2; }
  targets+=(--target "$2")
  shift 2
done
bash scripts/setup.sh
source scripts/libtorch.sh
ckpt_family_settings
log="$CKPT_BUILD_DIR.log"
cmake -S . -B "$CKPT_BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  "${CKPT_CMAKE_ARGS[@]}" "$@" > "$log" 2>&1 || { cat "$log"; exit 1; }
cmake --build "$CKPT_BUILD_DIR" -j "$(nproc)" "${targets[@]}"
