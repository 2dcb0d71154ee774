#!/usr/bin/env bash
# Installs what building and testing ckpt needs on Debian 12, if it is missing. Safe to re-run.
set -euo pipefail

packages=(
  cmake ninja-build g++ ccache          # toolchain
  libtorch-dev libopenblas0-pthread     # LibTorch 1.13 (CPU) and a fast BLAS for it
  libgtest-dev libgmock-dev             # tests
  libbenchmark-dev                      # micro-benchmarks
  libcli11-dev nlohmann-json3-dev       # the ckpt program
  python3-torch python3-numpy           # comparisons with torch.utils.checkpoint
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "ckpt: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
