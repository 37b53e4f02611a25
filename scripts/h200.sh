#!/usr/bin/env bash
# Run on the H200 device machine from the repo root: installs carried wheels, then a script.
#   bash scripts/h200.sh scripts/h200_capture.py
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-build-isolation --no-deps -e . >/dev/null 2>&1 || { echo "editable install failed"; exit 1; }
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
script=$1; shift
python3 "$script" "${OUT:-out}" "$@"
