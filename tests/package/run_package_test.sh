#!/bin/sh
# usage: run_package_test.sh BUILD_DIR WORK_DIR GENERATOR README
# Installs the build into WORK_DIR/prefix, then configures, builds and runs the consumer project
# against it with the README's ```cmake lines (find_package(ckpt CONFIG REQUIRED) and the link),
# and runs the installed `ckpt` program as installed: no LD_LIBRARY_PATH, its run path finds
# LibTorch.
set -e
build="$1"; work="$2"; generator="$3"; readme="$4"
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
sed -n '/^```cmake$/,/^```$/{/^```/d;p;}' "$readme" > "$work/readme.cmake"
grep -q find_package "$work/readme.cmake" || { echo "no \`\`\`cmake block with find_package in $readme"; exit 1; }
cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"
cmake -S "$here/consumer" -B "$work/build" -G "$generator" -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$work/prefix" -DREADME_CMAKE="$work/readme.cmake" > "$work/configure.log"
cmake --build "$work/build" > "$work/build.log"
"$work/build/app"
if [ -x "$work/build/app_distributed" ]; then "$work/build/app_distributed"; fi
"$work/build/app_emulated_device"

program="$work/prefix/bin/ckpt"
if [ -e "$program" ]; then  # built with the tools
  printf '%s\n' '{"input_bytes": 4096, "stages": [' \
    '{"forward_time": 1, "backward_time": 2, "output_bytes": 4096, "saved_bytes": 12288},' \
    '{"forward_time": 1, "backward_time": 2, "output_bytes": 4096, "saved_bytes": 12288}]}' \
    > "$work/chain.json"
  env -u LD_LIBRARY_PATH "$program" --help > "$work/help.txt"
  env -u LD_LIBRARY_PATH "$program" plan --chain "$work/chain.json" --budget 1MiB --json \
    > "$work/plan.json"
  grep -q '"feasible": *true' "$work/plan.json" ||
    { echo "the installed ckpt plan printed no feasible plan:"; cat "$work/plan.json"; exit 1; }
fi
