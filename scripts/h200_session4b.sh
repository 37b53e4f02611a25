#!/usr/bin/env bash
# Fourth session, second device call: CUPTI's start-up in the agent thread (tracer.prepare), token by token
# and in the real agent with PM running.   bash scripts/h200_session4b.sh  (H200 device machine, repo root)
set -u
source scripts/h200_setup.sh
timeout 200 python3 scripts/h200_window_costs.py "$OUT/window" --reps 10 --gap 30 \
  --variants now,pre_ctypes,pre_register > "$OUT/window.log" 2>&1
timeout 240 python3 scripts/h200_slow_tokens.py "$OUT/slow" --attach-s 8 --plan eager > "$OUT/slow.log" 2>&1
tail -c 2500 "$OUT/window.log"; tail -c 2500 "$OUT/slow.log"
