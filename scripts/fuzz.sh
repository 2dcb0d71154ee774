#!/usr/bin/env bash
# Builds the planner's libFuzzer target (tests/fuzz) with clang, ASan and UBSan in build-fuzz/ and
# runs it for SECONDS (default 60) from the committed corpus with the committed dictionary. New
# inputs go to build-fuzz/corpus, never into the repository; a crash leaves its input in
# build-fuzz/ and fails.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
CKPT_LIBTORCH=debian CKPT_SETUP_EXTRA="clang libclang-rt-14-dev" bash scripts/setup.sh
cmake -S tests/fuzz -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo > build-fuzz.log 2>&1 || { cat build-fuzz.log; exit 1; }
cmake --build build-fuzz
mkdir -p build-fuzz/corpus
build-fuzz/plan_fuzzer -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
  -dict=tests/fuzz/plan.dict -artifact_prefix=build-fuzz/ -print_final_stats=1 \
  build-fuzz/corpus tests/fuzz/corpus
