#!/usr/bin/env bash
# The GPU check (docs/gpu-check.md), one command on the lent machine: runs the programs that
# scripts/gpu-prepare.sh built here against that machine's LibTorch and that the call carries in
# .gpu/: the device suite's CUDA instances (none may skip for want of a device), one rank
# of data-parallel training on NCCL, `ckpt train --device cuda` under each strategy (the
# checkpointed losses must be the plain run's, bit for bit), the GPU benchmark tables, and
# offloading against full recompute beside Python's save_on_cpu (reported: a missed target does
# not fail the check). Nothing is built there and nothing is fetched.
#
# Without a CUDA device (the rehearsal, scripts/gpu-rehearse.sh) every step still runs: the CUDA
# tests skip, training and benchmarks run on ckpt's emulated accelerator instead, and the check
# exits 3 for that reason alone.
#   CKPT_PYTHON   the Python whose torch the programs run against (default: python3)
#   OUT           where the results go: summary.md, check.log, details.tar.gz (default: gpu-check)
#   CKPT_GPU_DIR  the prepared folder (default: .gpu)
#   CKPT_GPU_STEPS  the steps to run, of cuda-tests nccl-tests train bench offload (default: all)
# Exit status: 0 all passed on a GPU, 1 a step failed, 2 not prepared for this machine, 3 no GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
py=${CKPT_PYTHON:-python3}
out=${OUT:-gpu-check}
prepared=${CKPT_GPU_DIR:-.gpu}
mkdir -p "$out"
details=$(mktemp -d)
trap 'rm -rf "$details"' EXIT
summary=$out/summary.md
failures=0
check_start=$SECONDS

# record LINE: a line of the summary (and of the log).
record() { echo "$*" | tee -a "$summary"; }
failed() { record "- **FAILED**: $1"; failures=$((failures + 1)); }

# step NAME LIMIT_S COMMAND...: runs a step under a time limit, its output in details/NAME.txt,
# and records its time and outcome. The limits add up to 470 s: with the start, the whole check
# ends inside 8 minutes, whatever hangs.
step() {
  local name=$1 limit=$2 start=$SECONDS status
  shift 2
  echo "=== $name ($(date -u +%H:%M:%S))"
  timeout --kill-after=10 "$limit" "$@" > "$details/$name.txt" 2>&1
  status=$?
  tail -n 40 "$details/$name.txt"
  if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
    failed "$name: stopped at its limit of $limit s (details.tar.gz has its output so far)"
  elif [ "$status" -ne 0 ]; then
    failed "$name: exit status $status (details.tar.gz: $name.txt)"
  fi
  record "- $name: $((SECONDS - start)) s"
  return "$status"
}

# A GoogleTest run's outcome: passed, no failure, and no CUDA test skipped for want of a device.
# The others skip by design (two GPUs, a capacity only the emulated device has, ...): listed.
gtest_outcome() {  # NAME
  local file=$details/$1.txt passed skipped no_device
  passed=$(awk '/^\[  PASSED  \]/ { print $4 }' "$file")
  # Each skipped test's own line ends in its time; the summary lists it again without one.
  skipped=$(grep -cE '^\[  SKIPPED \] .* \([0-9]+ ms\)$' "$file")
  no_device=$(grep -c '^no CUDA device is present' "$file")
  record "  ${passed:-0} passed, $skipped skipped"
  grep -B1 -E '^\[  SKIPPED \] .* \([0-9]+ ms\)$' "$file" | grep -vE '^(\[|--)' | sort | uniq -c |
    while read -r count reason; do record "    $count skipped: $reason"; done
  [ -z "$gpu" ] && return 0
  [ "${passed:-0}" -gt 0 ] || failed "$1: no test passed"
  [ "$no_device" -eq 0 ] || failed "$1: $no_device CUDA tests found no device although a GPU is present"
}

# CKPT_GPU_STEPS: the steps to run (a retry of those that failed), default all.
wanted() { [[ " ${CKPT_GPU_STEPS:-cuda-tests nccl-tests train bench offload} " == *" $1 "* ]]; }

# What the check needs to know of the machine's Python and torch.
environment='
import os, torch
print("torch", torch.__version__.split("+")[0], torch.__version__, "CUDA", torch.version.cuda)
print("lib", os.path.join(os.path.dirname(torch.__file__), "lib"))
print("gpu", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")'

identical_losses='
import json, sys
sys.exit(0 if json.load(open(sys.argv[1]))["identical_losses"] else 1)'

main() {
  echo "# GPU check, $(date -u '+%Y-%m-%d %H:%M UTC')" > "$summary"
  if ! "$py" -c "$environment" > "$details/environment.txt" 2>&1; then
    cat "$details/environment.txt"
    echo "gpu-check: $py cannot import torch" >&2
    exit 2
  fi
  torch_version=$(awk '$1 == "torch" { print $2 }' "$details/environment.txt")
  torch_lib=$(awk '$1 == "lib" { print $2 }' "$details/environment.txt")
  gpu=$(sed -n 's/^gpu //p' "$details/environment.txt")
  record "- machine: $(nproc) cores; torch $(awk '$1 == "torch" { print $3, "CUDA", $5 }' \
    "$details/environment.txt"); GPU: ${gpu:-none}"

  if [ ! -f "$prepared/torch-version" ]; then
    echo "gpu-check: $prepared/ is missing: run scripts/gpu-prepare.sh first and carry it" >&2
    exit 2
  fi
  if [ "$(cat "$prepared/torch-version")" != "$torch_version" ]; then
    echo "gpu-check: $prepared/ was built against torch $(cat "$prepared/torch-version"), but $py" \
      "has torch $torch_version: prepare again with CKPT_GPU_TORCH_VERSION=$torch_version" >&2
    exit 2
  fi
  export LD_LIBRARY_PATH="$PWD/$prepared/lib:$torch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  if ldd "$prepared"/bin/* | grep 'not found'; then
    echo "gpu-check: the prepared programs miss the libraries above on this machine" >&2
    exit 2
  fi
  bin=$prepared/bin
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
  if [ -n "$gpu" ]; then device=cuda; else device=emulated; fi
  record "- device for training and benchmarks: $device"

  if wanted cuda-tests; then
    step cuda-tests 80 "$bin/ckpt_device_tests" --gtest_filter='Devices/*/CUDA:*BesideCuda.*'
    gtest_outcome cuda-tests
  fi
  if wanted nccl-tests; then
    step nccl-tests 40 "$bin/ckpt_distributed_tests" --gtest_filter='*_CUDA'
    gtest_outcome nccl-tests
  fi
  if wanted train; then
    for strategy in sequential:4 selective offload budget:35%; do
      name=train-${strategy%%:*}
      step "$name" 40 "$bin/ckpt" train --device "$device" --steps 20 --strategy "$strategy" \
        --json "$details/$name.json" &&
        { "$py" -c "$identical_losses" "$details/$name.json" ||
          failed "$name: the checkpointed losses differ from the plain run's"; }
    done
  fi

  # The rehearsal's emulated accelerator runs the benchmarks' kernels on this machine's CPU: there
  # they get small sizes (--quick), and Python's checkpoint (CUDA only) does not run.
  size=() python_args=(--python "$py" --script bench/compare/torch_checkpoint.py)
  [ "$device" = cuda ] || { size=(--quick); python_args=(--no-python); }
  if wanted bench; then
    step bench 130 "$bin/ckpt" bench --device "$device" "${size[@]}" --no-python --no-rss \
      --markdown "$details/bench.md"
  fi
  # The bench transformer (8 blocks, d = 128, 16 stages): no checkpointing, full recompute, ckpt's
  # offload of the same regions, and Python's save_on_cpu(pin_memory=True) and full recompute.
  if wanted offload; then
    step offload 60 "$bin/ckpt" bench --device "$device" --models transformer --no-planned \
      --no-rss "${size[@]}" "${python_args[@]}" --markdown "$details/offload-bench.md" \
      --offload-summary "$details/offload.md"
  fi
  for table in bench.md offload.md; do
    [ -f "$details/$table" ] && { echo; cat "$details/$table"; } >> "$summary"
  done

  tar -czf "$out/details.tar.gz" -C "$details" .
  record "- in all: $((SECONDS - check_start)) s"
  if [ "$failures" -gt 0 ]; then
    record "gpu-check: $failures step(s) failed"
    exit 1
  fi
  if [ -z "$gpu" ]; then
    record "gpu-check: every step passed, but there is no CUDA device here: the CUDA tests" \
      "skipped and the rest ran on the emulated accelerator (a rehearsal, not a GPU check)"
    exit 3
  fi
  record "gpu-check: passed on $gpu"
}

main 2>&1 | tee "$out/check.log"
exit "${PIPESTATUS[0]}"
