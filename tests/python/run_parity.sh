#!/bin/sh
# usage: run_parity.sh PYTHON_PARITY_BINARY PARITY_PY WORK_DIR
# Debian's python3-torch lives under /usr/bin/python3 (another python3 may come first on PATH).
# Exits 77 (skipped) when no Python with torch is found.
for py in "${CKPT_PYTHON:-}" /usr/bin/python3 python3; do
  [ -n "$py" ] && "$py" -c 'import torch, numpy' 2>/dev/null && break
  py=""
done
if [ -z "$py" ]; then
  echo "python3-torch is not installed: skipping the comparison with torch.utils.checkpoint"
  exit 77
fi
mkdir -p "$3" && "$1" "$3" && "$py" "$2" "$3"
