#!/usr/bin/env bash
# One device call: recordings + attach/detach cycles, then the overhead benchmark.
#   bash scripts/h200.sh scripts/h200_capture.py   (recordings)   then   python3 benchmarks/overhead.py
set -u
bash scripts/h200.sh scripts/h200_capture.py || echo "capture failed"
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
python3 benchmarks/overhead.py "${OUT:-out}" --phase-s 3 --pairs 5 2>&1 | tail -40
