# Sourced by the scripts: which LibTorch to build against, chosen by CKPT_LIBTORCH.
#   wheel (default)  LibTorch 2.x from the pinned `torch` wheel, in the project's own .venv
#   wheel-X.Y.Z      the `torch==X.Y.Z` wheel instead, in .venv-X.Y.Z, built in build-X.Y.Z (another
#                    LibTorch 2.x to check against, e.g. the lent GPU machine's 2.11.0)
#   debian           Debian's libtorch-dev 1.13.1 (CPU), with python3-torch for comparisons
#   <directory>      an unpacked LibTorch archive (pytorch.org), passed as CMAKE_PREFIX_PATH
# Sets CKPT_FAMILY, CKPT_BUILD_DIR, CKPT_VENV (the wheel families) and, once set up,
# CKPT_CMAKE_ARGS and CKPT_PYTHON.
CKPT_TORCH_VERSION=2.15.0  # the newest torch on PyPI when last checked; bump with care
CKPT_LIBTORCH=${CKPT_LIBTORCH:-wheel}
case "$CKPT_LIBTORCH" in
  wheel) CKPT_FAMILY=wheel; CKPT_BUILD_DIR=build; CKPT_VENV=.venv ;;
  wheel-[0-9]*.[0-9]*.[0-9]*)
    CKPT_TORCH_VERSION=${CKPT_LIBTORCH#wheel-}
    CKPT_FAMILY=wheel; CKPT_BUILD_DIR=build-$CKPT_TORCH_VERSION; CKPT_VENV=.venv-$CKPT_TORCH_VERSION ;;
  debian) CKPT_FAMILY=debian; CKPT_BUILD_DIR=build-debian ;;
  *)
    if [ ! -d "$CKPT_LIBTORCH" ]; then
      echo "ckpt: CKPT_LIBTORCH must be 'wheel', 'wheel-X.Y.Z' (a torch version), 'debian' or" \
        "the directory of an unpacked LibTorch, but got '$CKPT_LIBTORCH'" >&2
      exit 2
    fi
    CKPT_FAMILY=archive; CKPT_BUILD_DIR=build-archive ;;
esac

# The CUDA compiler for a CUDA build of the wheel: nvcc on the PATH, in /usr/local/cuda (where
# NVIDIA's packages put it, off the PATH, where CMake's CUDA language does not look), or NVIDIA's
# compiler wheels in the environment (scripts/setup.sh installs them on a machine without the
# toolkit). Prints its path; fails where there is none.
ckpt_nvcc() {
  local nvcc
  for nvcc in "$(command -v nvcc)" /usr/local/cuda/bin/nvcc \
    "$PWD/$CKPT_VENV"/lib/python3*/site-packages/nvidia/cu[0-9]*/bin/nvcc; do
    if [ -n "$nvcc" ] && [ -x "$nvcc" ]; then
      echo "$nvcc"
      return 0
    fi
  done
  return 1
}

# The CMake arguments and Python interpreter of the chosen family (after setup.sh has run).
ckpt_family_settings() {
  case "$CKPT_FAMILY" in
    wheel)
      CKPT_PYTHON="$PWD/$CKPT_VENV/bin/python"
      local torch_dir cuda nvcc
      torch_dir=$("$CKPT_PYTHON" -c 'import os, torch; print(os.path.dirname(torch.__file__))')
      # The torch directory itself first, so that its lib/ wins over a system libtorch.
      CKPT_CMAKE_ARGS=("-DCMAKE_PREFIX_PATH=$torch_dir;$torch_dir/share/cmake")
      # The wheel is a CUDA build, and its CMake files refuse to configure without the CUDA
      # toolkit's compiler, even for the CPU: it is named to CMake (see ckpt_nvcc).
      cuda=$("$CKPT_PYTHON" -c 'import torch; print(torch.version.cuda or "")')
      if [ -n "$cuda" ]; then
        if ! nvcc=$(ckpt_nvcc); then
          echo "ckpt: the torch wheel is a CUDA $cuda build, and LibTorch's CMake files need the" \
            "CUDA toolkit's compiler (nvcc) to build against it, which this machine lacks, and" \
            "NVIDIA's compiler wheels don't fit this torch's CUDA packages: install NVIDIA's" \
            "CUDA toolkit (into /usr/local/cuda or on the PATH), or build against Debian's" \
            "LibTorch 1.13 (CPU) with CKPT_LIBTORCH=debian" >&2
          exit 2
        fi
        CKPT_CMAKE_ARGS+=("-DCMAKE_CUDA_COMPILER=$nvcc")
        if [[ "$nvcc" == "$PWD/$CKPT_VENV/"* ]]; then  # the wheels: the toolkit is their folder
          local root
          root=$(dirname "$(dirname "$nvcc")")
          CKPT_CMAKE_ARGS+=("-DCUDAToolkit_ROOT=$root" "-DCUDA_TOOLKIT_ROOT_DIR=$root")
        fi
      fi ;;
    debian)
      CKPT_PYTHON=/usr/bin/python3
      CKPT_CMAKE_ARGS=() ;;
    archive)
      CKPT_PYTHON=""
      CKPT_CMAKE_ARGS=("-DCMAKE_PREFIX_PATH=$(cd "$CKPT_LIBTORCH" && pwd)") ;;
  esac
  CKPT_CMAKE_ARGS+=("-DCKPT_PYTHON=$CKPT_PYTHON")
  ckpt_compiler_cache
}

# ccache, when installed: paths relative to the clone, so that every clone shares the cache, and
# the sloppiness that lets it cache files built with the tests' precompiled header (without it,
# ccache refuses each of them and every fresh clone recompiles the whole test suite). With debug
# information (the sanitizers' RelWithDebInfo builds) ccache also hashes the build's directory
# unless told not to: without CCACHE_NOHASHDIR every fresh clone recompiled both sanitizer builds.
# The four builds (two families, two sanitizers; debug information) outgrow ccache's default 5 GB,
# which evicted part of one build while compiling the next. Depend mode: on a miss, ccache
# otherwise runs the preprocessor once more to hash the file, which cannot use the precompiled
# header: 2.5 CPU-seconds for a test file, the whole of a cold build's 170 files several minutes.
# It hashes what the compiler's dependency file (-MD, which Ninja asks for) lists instead.
ckpt_compiler_cache() {
  command -v ccache >/dev/null || return 0
  CKPT_CMAKE_ARGS+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  export CCACHE_BASEDIR="$PWD"
  export CCACHE_DEPEND=1
  export CCACHE_NOHASHDIR=1
  export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-20G}"
  export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
}
