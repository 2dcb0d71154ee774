#!/usr/bin/env bash
# Configures and builds ckpt in build/ (Release, Ninja). Extra arguments go to CMake.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" "$@" > build.log 2>&1 ||
  { cat build.log; exit 1; }
cmake --build build -j "$(nproc)"
