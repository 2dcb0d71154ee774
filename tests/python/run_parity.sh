#!/bin/sh
# usage: run_parity.sh PYTHON_PARITY_BINARY PARITY_PY WORK_DIR [PYTHON [LIBTORCH_VERSION]]
# With PYTHON given (CMake's CKPT_PYTHON), it must have torch at LIBTORCH_VERSION: the comparison
# is between the same LibTorch from C++ and from Python. Without it, looks for Debian's
# python3-torch at /usr/bin/python3 (another python3 may come first on PATH) and exits 77
# (skipped) when no Python with torch is found.
if [ -n "$4" ]; then
  py="$4"
  # The release number alone: "2.15.0+cu132" and Debian's "1.13.0a0" name 2.15.0 and 1.13.0.
  version=$("$py" -c 'import re, torch, numpy; print(re.match(r"[0-9.]*[0-9]", torch.__version__)[0])') || {
    echo "CKPT_PYTHON=$py has no torch and numpy"; exit 1; }
  if [ -n "$5" ] && [ "$version" != "$5" ]; then
    echo "CKPT_PYTHON=$py has torch $version, but ckpt was built against LibTorch $5"; exit 1
  fi
else
  for py in /usr/bin/python3 python3; do
    "$py" -c 'import torch, numpy' 2>/dev/null && break
    py=""
  done
  if [ -z "$py" ]; then
    echo "no Python with torch: skipping the comparison with torch.utils.checkpoint"
    exit 77
  fi
fi
"$py" -c 'import torch; print("Python torch", torch.__version__)'
mkdir -p "$3" && "$1" "$3" && "$py" "$2" "$3"
