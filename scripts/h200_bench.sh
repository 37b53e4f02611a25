#!/usr/bin/env bash
# Device call: the overhead benchmark alone (both modes), copied back with the markdown it writes.
#   bash scripts/h200_bench.sh
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
python3 -m pip install -q --no-build-isolation --no-deps -e . >/dev/null 2>&1 || { echo "editable install failed"; exit 1; }
O=${OUT:-out}
timeout 540 python3 benchmarks/overhead.py /tmp/bench --phase-s 4 --pairs 5 --long-s 20 > $O/bench.log 2>&1
cp /tmp/bench/overhead.json $O/ 2>/dev/null; cp docs/benchmarks.md $O/benchmarks_generated.md
echo "bench done at $(( $(date +%s) - T0 )) s"; tail -c 3000 $O/bench.log
