#!/usr/bin/env bash
# Device call 2 of 2: the live fault checks (their engines without PM sampling, which the soak's engine holds)
# while the soak started by scripts/h200_bench_then_soak.sh finishes; then its results.
set -u
T0=$(date +%s)
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
O=${OUT:-out}; mkdir -p /tmp/faults
tail -2 /tmp/soak/log
DECODEMON_PM=off timeout 300 python3 scripts/h200_faults.py /tmp/faults/out > $O/faults.log 2>&1
cp /tmp/faults/out/faults.json $O/ 2>/dev/null
echo "faults done at $(( $(date +%s) - T0 )) s"
while pgrep -f h200_soak.py >/dev/null && [ $(( $(date +%s) - T0 )) -lt 580 ]; do sleep 3; done
cp /tmp/soak/soak.json /tmp/soak/log $O/ 2>/dev/null; echo "soak collected at $(( $(date +%s) - T0 )) s"; tail -2 /tmp/soak/log
