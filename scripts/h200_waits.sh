#!/bin/bash
# What an attached eager decode thread waits on, and which part of the attach makes it wait (~5 minutes):
# one engine with default attaches, attaches without PM, without windows and with neither interleaved (3 rounds of
# 7 s phases, scripts/h200_migrations.py --variants; each phase's ms/token, C canary and slow-core share), then the engine's CPU and faults split by thread (now that the
# agent's threads carry OS names) and the monitor's CPU (scripts/h200_monitor_cpu_live.py).
#   source scripts/h200_setup.sh; bash scripts/h200_waits.sh "$OUT"
# A dry run on a CPU machine's tiny engine: BENCH_CPU=1 PHASE_S=1.5 bash scripts/h200_waits.sh OUT
set -u
out=${1:?OUTDIR}; mkdir -p "$out"
ph=${PHASE_S:-7}; cpu=""; [ "${BENCH_CPU:-0}" = 1 ] && cpu="--cpu"
(git log --oneline -1 2>/dev/null; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u) \
  > "$out/when.txt" 2>&1
timeout 280 python3 scripts/h200_migrations.py "$out/waits" --phase-s "$ph" --rounds 3 \
  --variants ";--no-pm;--no-trace;--no-pm --no-trace" \
  $cpu > "$out/waits.log" 2>&1
timeout 150 python3 scripts/h200_monitor_cpu_live.py "$out/threads" --mode eager --phase-s 10 $cpu > "$out/threads.log" 2>&1
rm -f "$out"/threads/monitor.prof
date -u >> "$out/when.txt"
python3 - "$out/waits/migrations.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for lab, v in d["by_label"].items():
    print(lab, d["variants"].get(lab, ""), json.dumps({k: x for k, x in v.items() if k != "asleep_on"}))
PY
tail -6 "$out/threads.log"
