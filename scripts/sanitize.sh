#!/usr/bin/env bash
# The suite under sanitizers, against Debian's LibTorch 1.13 (LibTorch itself is not instrumented).
# usage: sanitize.sh [asan|tsan] [CTEST_ARGS...]   (no mode: both)
#   asan  build-asan/: AddressSanitizer + UndefinedBehaviorSanitizer + LeakSanitizer, the whole
#         suite: CI's only 1.13 build, so every test runs on 1.13 here (the installed package's
#         test, which builds an uninstrumented consumer, runs in the 2.x suite)
#   tsan  build-tsan/: ThreadSanitizer, the tests where threads share models, allocators, planners
# A finding in ckpt's code fails; tests/sanitizers/*.supp silence LibTorch's internals only.
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-both}"
[ $# -gt 0 ] && shift
case "$mode" in
  asan | tsan | both) ;;
  *) echo "ckpt: sanitize.sh: the mode is asan, tsan or nothing (both), not '$mode'" >&2; exit 2 ;;
esac
export CKPT_LIBTORCH=debian
bash scripts/setup.sh
source scripts/libtorch.sh
ckpt_family_settings
here="$PWD/tests/sanitizers"

# -O1 -g1, as the sanitizers' own documentation advises: line tables are enough for their stack
# traces, and the build is faster and smaller than at -O2 or with full debug information.
# Instrumented code makes GCC's flow analysis see "maybe uninitialized" values in LibTorch's headers
# (c10::intrusive_ptr moves) that the normal build doesn't: those warnings are off here.
configure() {  # DIR FLAGS CMAKE_ARGS...
  local dir="$1" flags="$2"
  shift 2
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${CKPT_CMAKE_ARGS[@]}" \
    -DCKPT_BUILD_BENCH=OFF -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
    -DCMAKE_CXX_FLAGS="$flags -fno-omit-frame-pointer -Wno-maybe-uninitialized" \
    -DCMAKE_EXE_LINKER_FLAGS="$flags" -DCMAKE_SHARED_LINKER_FLAGS="$flags" "$@" > "$dir.log" 2>&1 ||
    { cat "$dir.log"; exit 1; }
}

if [ "$mode" != tsan ]; then
  echo "=== AddressSanitizer + UndefinedBehaviorSanitizer + LeakSanitizer (build-asan/)"
  configure build-asan "-fsanitize=address,undefined -fno-sanitize-recover=undefined"
  # Test discovery runs the test programs during the build: no leak report at their exit there.
  ASAN_OPTIONS=detect_leaks=0 cmake --build build-asan -j "$(nproc)"
  (
    cd build-asan
    export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:detect_odr_violation=0"
    export LSAN_OPTIONS="suppressions=$here/lsan.supp:print_suppressions=0"
    export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
    OMP_NUM_THREADS=1 ctest --output-on-failure -j "$(nproc)" -E '^Package\.' "$@"
  )
fi

if [ "$mode" != asan ]; then
  echo "=== ThreadSanitizer (build-tsan/)"
  configure build-tsan "-fsanitize=thread" -DCKPT_BUILD_TOOLS=OFF
  # Only the test files that hold these tests are compiled under it (tests/CMakeLists.txt).
  cmake --build build-tsan -j "$(nproc)" --target ckpt_thread_tests
  TSAN_OPTIONS="suppressions=$here/tsan.supp:halt_on_error=1:second_deadlock_stack=1" \
    OMP_NUM_THREADS=1 build-tsan/tests/ckpt_thread_tests \
    --gtest_filter='SharedParametersThreads*:*Concurrent*:MemoryTrackerTest.*Thread*:*AnotherThread*'
fi
