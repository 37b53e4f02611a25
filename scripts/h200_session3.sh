#!/usr/bin/env bash
# Device calls 1-2 of 2026-11-29 evening (call 2 after the GIL fixes): which PM counter matches kernel time (busy), where the slow tokens of an
# attach come from (PM pump / window / attach), whether a traced window leaks in the decode process, and tokens
# with and without the probe in one process.
set -u
T0=$(date +%s)
source scripts/h200_setup.sh
O=${OUT:-out}; mkdir -p /tmp/bm /tmp/cc /tmp/st
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw --format=csv > $O/nvidia_smi.txt
timeout 180 python3 scripts/h200_busy_metrics.py /tmp/bm > $O/busy_metrics.log 2>&1
cp /tmp/bm/busy_metrics.json $O/ 2>/dev/null; echo "busy done at $(( $(date +%s) - T0 )) s"
timeout 180 python3 scripts/h200_cupti_cycles.py /tmp/cc --cycles 300 > $O/cupti_cycles.log 2>&1
cp /tmp/cc/cupti_cycles.json $O/ 2>/dev/null; echo "cycles done at $(( $(date +%s) - T0 )) s"
timeout 200 python3 scripts/h200_slow_tokens.py /tmp/st --attach-s 8 > $O/slow_tokens.log 2>&1
cp /tmp/st/slow_tokens.json $O/ 2>/dev/null; echo "slow tokens done at $(( $(date +%s) - T0 )) s"
tail -c 1500 $O/busy_metrics.log; tail -c 1200 $O/cupti_cycles.log; tail -c 2500 $O/slow_tokens.log
