#!/bin/sh
# usage: run_package_test.sh BUILD_DIR WORK_DIR GENERATOR
# Installs the build into WORK_DIR/prefix, then configures, builds and runs the consumer project
# against it with find_package(ckpt CONFIG REQUIRED).
set -e
build="$1"; work="$2"; generator="$3"
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"
cmake -S "$here/consumer" -B "$work/build" -G "$generator" -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$work/prefix" > "$work/configure.log"
cmake --build "$work/build" > "$work/build.log"
"$work/build/consumer"
