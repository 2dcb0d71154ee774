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
  # LibTorch's CMake files need the CUDA toolkit's compiler, even for a CPU build. Without a
  # toolkit here, NVIDIA's compiler wheels of the CUDA runtime that torch installed go beside it
  # (the CUDA 13 wheels share one folder, nvidia/cu13, which then holds a toolkit), and its
  # libraries get the unversioned names that CMake's FindCUDA looks for.
  if ! ckpt_nvcc > /dev/null; then
    read -r cuda_dir runtime < <("$CKPT_VENV/bin/python" -c '
import importlib.metadata as metadata, os, torch
major = (torch.version.cuda or "").split(".")[0]
folder = os.path.join(os.path.dirname(os.path.dirname(torch.__file__)), "nvidia", "cu" + major)
try:
    runtime = metadata.version("nvidia-cuda-runtime")
except metadata.PackageNotFoundError:
    runtime = ""
fits = major and runtime and os.path.isfile(os.path.join(folder, "include", "cuda_runtime.h"))
print(folder if fits else "-", runtime or "-")')
    if [ "$cuda_dir" != - ]; then
      echo "ckpt: no CUDA toolkit here: installing NVIDIA's CUDA $runtime compiler into $CKPT_VENV"
      "$CKPT_VENV/bin/python" -m pip install -q --disable-pip-version-check --no-compile \
        "nvidia-cuda-nvcc==$runtime" "nvidia-nvvm==$runtime"
      for library in "$cuda_dir"/lib/lib*.so.*; do
        [ -e "${library%%.so.*}.so" ] || ln -s "$(basename "$library")" "${library%%.so.*}.so"
      done
    fi
  fi
fi
