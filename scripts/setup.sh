#!/usr/bin/env bash
# Installs what building and testing ckpt needs on Debian 12, if it is missing. Safe to re-run.
# CKPT_LIBTORCH (see scripts/libtorch.sh) chooses the LibTorch: the `torch` wheel in .venv
# (default), another torch version's wheel in its own .venv-X.Y.Z, or Debian's libtorch-dev.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/libtorch.sh

packages=(
  cmake ninja-build g++ ccache          # toolchain
  libgtest-dev libgmock-dev             # tests
  libbenchmark-dev                      # micro-benchmarks
  libcli11-dev nlohmann-json3-dev       # the ckpt program
  libgloo-dev                           # Gloo's headers, for ckpt::distributed (c10d)
  python3-venv python3-numpy            # the wheel's virtual environment; parity tests
)
case "$CKPT_FAMILY" in
  debian) packages+=(libtorch-dev libopenblas0-pthread python3-torch) ;;  # OpenBLAS: 20x faster
esac
# What one script needs beyond the build (scripts/fuzz.sh: clang and its libFuzzer runtime).
read -r -a extra <<< "${CKPT_SETUP_EXTRA:-}"
packages+=("${extra[@]}")

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

if [ "$CKPT_FAMILY" = wheel ]; then
  # The project's own environment, never the system's Python; a re-run finds it, installs nothing.
  # --no-compile: Python compiles a module when it is first imported; compiling all of torch's
  # thousands at install time is work that a build and its tests mostly never use.
  if ! "$CKPT_VENV/bin/python" -c "import torch, numpy, sys; sys.exit(torch.__version__.split('+')[0] != '$CKPT_TORCH_VERSION')" 2>/dev/null; then
    echo "ckpt: installing torch==$CKPT_TORCH_VERSION into $CKPT_VENV (several GB the first time)"
    /usr/bin/python3 -m venv "$CKPT_VENV"
    "$CKPT_VENV/bin/python" -m pip install -q --disable-pip-version-check --no-compile \
      "torch==$CKPT_TORCH_VERSION" numpy
  fi
fi
