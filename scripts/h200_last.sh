#!/usr/bin/env bash
# A short device call: eager/graph recordings with in-process PM evaluation, then the overhead benchmark.
set -u
CAPTURE_QUICK=1 bash scripts/h200.sh scripts/h200_capture.py || echo "capture failed"
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
R=/tmp/results; mkdir -p $R
timeout 120 python3 benchmarks/overhead.py $R --phase-s 2.5 --pairs 5 --modes graph 2>&1 | tail -12
tar czf "${OUT:-out}/results.tar.gz" -C $R .
