#!/usr/bin/env bash
# On a machine with an NVIDIA GPU and a Python whose torch is a CUDA build: builds ckpt against
# that torch's LibTorch, runs the *_CUDA tests (none may skip), and benchmarks the bench models on
# the GPU (and one rank of data-parallel training on NCCL): peak memory (the caching allocator's statistics) and step time for no checkpointing,
# checkpoint_sequential and planned schedules, one table per model.
#   CKPT_PYTHON  the Python with torch (default: python3)
#   OUT          where the results go (default: ./gpu-check)
# Needs cmake, a C++17 compiler, GoogleTest, CLI11, nlohmann-json and Gloo's headers (libgloo-dev:
# ckpt::distributed) (scripts/setup.sh installs
# them on Debian).
set -euo pipefail
cd "$(dirname "$0")/.."
py=${CKPT_PYTHON:-python3}
out=${OUT:-gpu-check}
mkdir -p "$out"
"$py" -c 'import torch, sys; ok = torch.cuda.is_available(); print("torch", torch.__version__, "CUDA", torch.version.cuda, torch.cuda.get_device_name(0) if ok else "no GPU"); sys.exit(0 if ok else 1)' ||
  { echo "gpu-check: this machine has no CUDA device that $py's torch can use" >&2; exit 1; }
torch_dir=$("$py" -c 'import os, torch; print(os.path.dirname(torch.__file__))')
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S . -B build-gpu "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$torch_dir;$torch_dir/share/cmake" -DCKPT_PYTHON="$(command -v "$py")" \
  -DCKPT_BUILD_TOOLS=OFF > "$out/configure.log" 2>&1 || { cat "$out/configure.log"; exit 1; }
cmake --build build-gpu -j "$(nproc)" --target ckpt_tests ckpt_distributed_tests compare_bench \
  2>&1 | tail -n 20

echo "=== CUDA tests"
./build-gpu/tests/ckpt_tests --gtest_filter='*_CUDA' 2>&1 | tee "$out/cuda-tests.txt"
if grep -q '\[  SKIPPED \]' "$out/cuda-tests.txt"; then
  echo "gpu-check: some CUDA tests skipped although a GPU is present" >&2
  exit 1
fi

echo "=== Data-parallel training on NCCL, one rank"
./build-gpu/tests/ckpt_distributed_tests --gtest_filter='*_CUDA' 2>&1 |
  tee "$out/distributed-tests.txt"
if grep -q '\[  SKIPPED \]' "$out/distributed-tests.txt" ||
   ! grep -q '\[  PASSED  \] 1 test' "$out/distributed-tests.txt"; then
  echo "gpu-check: the NCCL data-parallel test did not pass although a GPU is present" >&2
  exit 1
fi

echo "=== GPU benchmark"
./build-gpu/bench/compare_bench --device cuda --no-python --no-rss \
  --markdown "$out/gpu-bench.md" > "$out/gpu-bench.txt"
cat "$out/gpu-bench.md"
