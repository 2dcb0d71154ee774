#!/usr/bin/env bash
# Prepares the GPU check (docs/gpu-check.md) here, so that the lent machine builds nothing: builds
# the programs scripts/gpu-check.sh runs against the lent machine's LibTorch (the `torch` wheel
# CKPT_GPU_TORCH_VERSION, default 2.11.0 with CUDA 13.0, in .venv-X.Y.Z) and puts them, stripped,
# into .gpu/bin, with the libraries they link that are neither torch's nor the C/C++ runtime's in
# .gpu/lib (the lent machine has no package registry). The call carries .gpu (64 MiB at most).
set -euo pipefail
cd "$(dirname "$0")/.."
version=${CKPT_GPU_TORCH_VERSION:-2.11.0}
export CKPT_LIBTORCH=wheel-$version
bash scripts/build.sh --target ckpt_device_tests --target ckpt_distributed_tests --target ckpt_cli
source scripts/libtorch.sh

rm -rf .gpu
mkdir -p .gpu/bin .gpu/lib
for program in tests/ckpt_device_tests tests/ckpt_distributed_tests tools/ckpt/ckpt; do
  strip -o ".gpu/bin/$(basename "$program")" "$CKPT_BUILD_DIR/$program"
done
# What the programs link beyond torch's folder, the wheel's nvidia-* libraries and the C and C++
# runtimes, which every machine that runs the wheel has.
runtime='^(linux-vdso|ld-linux-x86-64|libc|libm|libdl|librt|libpthread|libutil|libstdc\+\+'
runtime+='|libgcc_s)\.so'
ldd .gpu/bin/* | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' | sort -u |
  while read -r name path; do
    [[ "$path" == "$PWD/$CKPT_VENV/"* || "$name" =~ $runtime ]] && continue
    cp -L "$path" ".gpu/lib/$name"
  done
echo "$version" > .gpu/torch-version
echo "ckpt: prepared .gpu/ for torch $version ($(du -sh .gpu | cut -f1)):" \
  "$(ls .gpu/bin | tr '\n' ' ')+ $(ls .gpu/lib | wc -l) libraries"
