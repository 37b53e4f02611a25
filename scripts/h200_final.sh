#!/usr/bin/env bash
# The whole H200 session in one device call: recordings, live screenshots, overhead benchmark.
set -u
bash scripts/h200.sh scripts/h200_capture.py || echo "capture failed"
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
R=/tmp/results; mkdir -p $R
python3 scripts/h200_screenshot.py $R 2>&1 | tail -5
python3 benchmarks/overhead.py $R --phase-s 3 --pairs 5 2>&1 | tail -45
tar czf "${OUT:-out}/results.tar.gz" -C $R .
