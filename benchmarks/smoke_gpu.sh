#!/usr/bin/env bash
# The GPU node's one command for the device smoke (benchmarks/smoke_gpu.py), from the checkout's root:
#
#   bash benchmarks/smoke_gpu.sh            # the table goes to $OUT (the device tool's folder), else ./smoke-out
#   bash benchmarks/smoke_gpu.sh --cpu      # the same with small shapes on CPU (what the CPU test runs)
#
# Offline: installs only the wheels that `python benchmarks/smoke_gpu_wheels.py` put in .smoke-wheels/
# (carried to the node beside the working tree) into a scratch folder with pip's --no-index, puts that
# folder first on PYTHONPATH (torch, transformers and the rest are the node's own), then runs the smoke.
# PYTHON (default python3) and SMOKE_WHEELS (default .smoke-wheels) can point elsewhere; other arguments
# go to smoke_gpu.py.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
wheels=${SMOKE_WHEELS:-.smoke-wheels}
shopt -s nullglob
found=("$wheels"/*.whl)
if [ ${#found[@]} -eq 0 ]; then
  echo "no wheels in $wheels: run 'python benchmarks/smoke_gpu_wheels.py' where the registry answers, and carry $wheels" >&2
  exit 2
fi
site=$(mktemp -d "${TMPDIR:-/tmp}/npr-smoke-site.XXXXXX")
PIP_NO_INDEX=1 "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  --disable-pip-version-check --target "$site" "${found[@]}"
export PYTHONPATH="$site:$PWD" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
"$py" -c 'import sys, torch, transformers, pydantic; print(f"python {sys.version.split()[0]}, torch {torch.__version__}, transformers {transformers.__version__}, pydantic {pydantic.__version__}, cuda {torch.cuda.is_available()}")'
exec "$py" benchmarks/smoke_gpu.py --out "${OUT:-smoke-out}" "$@"
