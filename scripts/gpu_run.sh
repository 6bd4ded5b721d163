#!/usr/bin/env bash
# The GPU run on a bare CUDA machine with no network (docs/gpu-run.md): from the repo root, with
# gpu-run/ (scripts/pack_gpu_run.sh) carried beside it, every step into one JSON file in $OUT.
#   scripts/gpu_run.sh                     all steps (build, twins, replay, speed, overhead)
#   scripts/gpu_run.sh --step build        one step (each fits a ten-minute command; rerun to resume)
#   scripts/gpu_run.sh --cpu --tiny        the CPU test: no CUDA, tiny twins
# Python: $PYTHON, else the first of python3.12 and python3 that has numpy (the rest comes from
# gpu-run/wheels).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-}
if [ -z "$python" ]; then
  for candidate in python3.12 python3; do
    if "$candidate" -c 'import numpy' >/dev/null 2>&1; then
      python=$candidate
      break
    fi
  done
fi
if [ -z "$python" ]; then
  echo "error: no python3.12 or python3 with numpy here: set PYTHON" >&2
  exit 1
fi
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH  # the toolkit's usual place, often not on PATH
fi
exec "$python" scripts/gpu_run.py "$@"
