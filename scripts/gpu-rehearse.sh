#!/usr/bin/env bash
# Rehearses the GPU check here (docs/gpu-check.md): prepares .gpu/ (scripts/gpu-prepare.sh), then
# runs scripts/gpu-check.sh as the lent machine would, with that machine's torch (the prepared
# version's .venv) and without what it lacks: in a mount namespace of its own, every file of the
# Debian packages the build used that the lent machine has not (GoogleTest, Google Benchmark,
# CLI11, nlohmann-json, Gloo) and of Debian's LibTorch is covered by an empty one. Passes when
# the check's only complaint is the missing GPU (its exit status 3). Needs root (unshare).
#   OUT  where the check's results go (default: gpu-check)
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
bash scripts/gpu-prepare.sh
prepared_in=$((SECONDS - start))
version=$(cat .gpu/torch-version)
mapfile -t packages < <(dpkg-query -W -f '${db:Status-Abbrev} ${Package}\n' 'libgtest*' \
  'libgmock*' 'libbenchmark*' 'libcli11*' 'nlohmann-json*' 'libgloo*' 'libtorch*' \
  'python3-torch*' 2>/dev/null | awk '$1 == "ii" { print $2 }')
echo "ckpt: hiding ${packages[*]}"
status=0
OUT=${OUT:-gpu-check} CKPT_PYTHON="$PWD/.venv-$version/bin/python" \
  unshare --mount --propagation private bash -c '
    set -e
    dpkg -L "$@" | while read -r f; do
      if [ -f "$f" ]; then mount --bind /dev/null "$f"; fi
    done
    [ ! -s /usr/include/gtest/gtest.h ] || { echo "ckpt: could not hide GoogleTest" >&2; exit 1; }
    exec bash scripts/gpu-check.sh' hide "${packages[@]}" || status=$?
echo "ckpt: rehearsal: prepared in $prepared_in s, checked in $((SECONDS - start - prepared_in)) s," \
  "the check's exit status $status"
if [ "$status" -ne 3 ]; then
  echo "ckpt: the rehearsal failed: the check should fail for the missing GPU alone (status 3)" >&2
  exit 1
fi
echo "ckpt: the rehearsal passed: everything but the GPU is there"
