#!/usr/bin/env bash
# Device call 1 of 2 (session of 2026-11-29, afternoon): which probe part shifts a graphed loop's speed
# (scripts/h200_clocks.py, engine A), the overhead benchmark in both modes, then the live soak started in
# its own session so it outlives this call (the next call, scripts/h200_faults_during_soak.sh, collects it).
set -u
T0=$(date +%s)
source scripts/h200_setup.sh
O=${OUT:-out}; mkdir -p $O /tmp/clk /tmp/bench /tmp/soak
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,pstate --format=csv | tee $O/gpu.txt
timeout 100 python3 scripts/h200_clocks.py /tmp/clk/out A > $O/clocks.log 2>&1; cp /tmp/clk/out/clocks.json $O/ 2>/dev/null
echo "clocks done at $(( $(date +%s) - T0 )) s"
timeout 440 python3 benchmarks/overhead.py /tmp/bench --phase-s 4 --pairs 5 --long-s 20 > $O/bench.log 2>&1
cp /tmp/bench/overhead.json /tmp/bench/benchmarks.md $O/ 2>/dev/null
echo "bench done at $(( $(date +%s) - T0 )) s"; tail -5 $O/bench.log
setsid nohup python3 scripts/h200_soak.py /tmp/soak --minutes 10.1 > /tmp/soak/log 2>&1 < /dev/null &
while [ $(( $(date +%s) - T0 )) -lt 565 ]; do sleep 5; done
cp /tmp/soak/log $O/soak_partial.log; echo "left at $(( $(date +%s) - T0 )) s"; tail -3 /tmp/soak/log
