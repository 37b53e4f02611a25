# One GPU lease's work, in two calls of the device, one right after the other (the machine stays warm 30 s):
#
#   bash benchmarks/gpu_round.sh OUTDIR one   starts llama.cpp's CUDA build detached on cores 8-15 (llama_cpp.sh's
#                                            setup); then, on cores 0-7, decodemon's CUPTI library smoke-tested in the
#                                            demo engine (eager and graphed, attached by pid), the first attach's cost
#                                            to the eager manual transformers loop (cost.py) and the compiled Llama-8B
#                                            loop with marks recorded five times in a row (counters.py)
#   bash benchmarks/gpu_round.sh OUTDIR solo  `one` without llama.cpp's build, for a lease of a single call
#                                            (COST_S and COUNTERS_S shorten its two benchmarks to fit the call)
#   bash benchmarks/gpu_round.sh OUTDIR two   torch.profiler's count of the compiled 8B loop, then the llama.cpp
#                                            cases (llama_cpp.sh run, CASES to choose) as far as the call goes
#   bash benchmarks/gpu_round.sh OUTDIR rest  llama.cpp's build detached, as `one`; then the first attach held 60 s
#                                            before and after (cost.py) and the compiled 8B loop with marks recorded
#                                            five times in a row (counters.py: its later windows' CUPTI start-up off
#                                            the decode thread, the agent's CPU over each record); follow it with
#   bash benchmarks/gpu_round.sh OUTDIR last  a C++ CUDA loop (counters.py cuda_loop), the compiled 8B loop with no
#                                            marks attached by pid five times (unmodified.py compiled_8b_plain), then
#                                            the quantized-KV llama-server case on the build `rest` started (CASES)
#
#   bash benchmarks/gpu_round.sh OUTDIR first FIRST_RUNS (2) fresh eager manual loops, nothing else on the machine, one
#                                            first attach each (cost.py): its slowest token against the 30 s before,
#                                            beside the loop's own slowest in stretches of that length before it;
#                                            with SMOKE=1, the demo engine's smoke first (SMOKE_MODES: eager graph);
#                                            PAIRS (2) A/A pairs after each (each ~13 s: give COST_S room for more)
#
# Run from the repository root with .whl/ carried (`bash benchmarks/wheels.sh`). Each call leaves at most 8 files
# under OUTDIR: the tables and a .tgz of the JSON, logs and recordings.
set -uo pipefail
out=${1:?OUTDIR}
stage=${2:?one or two}
mkdir -p "$out"
smoke() {  # decodemon's CUPTI library in Python targets (probes/native_tracer.py): the demo engine, plainly started
  for mode in ${SMOKE_MODES:-eager graph}; do
    PYTHONPATH=$ENGINE_MARKS_PATH $ENGINE_PY -m decodemon.engine_adapter.demo --mode $mode --tokens 0 \
      >"$out/r/demo_$mode.log" 2>&1 &
    dp=$!
    sleep 12
    timeout 40 $DM_PY -m decodemon.monitor.cli record $dp -o "$out/r/demo_$mode.dmon" --seconds 8 \
      2>"$out/r/native_$mode.err"
    echo "native $mode record exit $?; target $(kill -0 $dp 2>/dev/null && echo alive || echo GONE)"
    kill $dp 2>/dev/null; wait $dp 2>/dev/null
    $DM_PY -m decodemon.monitor.cli replay "$out/r/demo_$mode.dmon" --json >"$out/r/native_$mode.json" 2>>"$out/r/native_$mode.err"
    $DM_PY benchmarks/native_smoke.py "$out/r/native_$mode.json" 2>&1 | tail -12
    tail -n 3 "$out/r/native_$mode.err"
  done
}
freeze_check() {  # the engine venv's pip freeze against the one before decodemon was installed
  freeze_engine "after_$1"
  for f in after_install "after_$1"; do
    if cmp -s /tmp/freeze/before_install.txt "/tmp/freeze/$f.txt"; then echo "engine pip freeze $f: unchanged"
    else echo "engine pip freeze $f: CHANGED"; diff /tmp/freeze/before_install.txt "/tmp/freeze/$f.txt" | head; fi
  done
  cp -r /tmp/freeze "$out/r/"
}
case "$stage" in
  one|solo)
    # the setup returns at once; the build and the GGUFs go on in the background
    [ "$stage" = one ] && JOBS=8 SETUP_WAIT=0 CHECK_PM=0 taskset -c 8-15 bash benchmarks/llama_cpp.sh "$out" setup 2>&1 | tail -n 20
    t0=$(date +%s); . benchmarks/device_setup.sh || exit 1; echo "device_setup $(( $(date +%s) - t0 )) s"
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u +%FT%TZ; git log -1 --format=%h 2>/dev/null
    mkdir -p "$out/r"
    taskset -c 0-7 bash -c "$(declare -f smoke); out=$out smoke"
    taskset -c 0-7 timeout ${COST_S:-170} $DM_PY benchmarks/cost.py "$out/r/cost" --engines manual --pairs 3 --phase-s 3 \
      --before-s 30 --after-s 40 --warm-s 20 > "$out/r/cost.log" 2>&1
    echo "cost.py exit $?"; tail -n 25 "$out/r/cost.log"
    taskset -c 0-7 timeout ${COUNTERS_S:-230} $DM_PY benchmarks/counters.py "$out/r/counters" --cases compiled8b_marks \
      > "$out/r/counters.log" 2>&1
    echo "counters.py exit $?"; tail -n 25 "$out/r/counters.log"
    freeze_check one
    (cd "$out/r" && tar czf ../round_one.tgz .) && rm -rf "$out/r"
    ;;
  two)
    . benchmarks/device_setup.sh || exit 1
    mkdir -p "$out/r"
    timeout 170 $DM_PY benchmarks/counters.py "$out/r/counters" --cases compiled8b_profile > "$out/r/profile.log" 2>&1
    echo "counters.py (profile) exit $?"; tail -n 12 "$out/r/profile.log"
    freeze_check two
    (cd "$out/r" && tar czf ../round_two.tgz .) && rm -rf "$out/r"
    LLAMA_S=${LLAMA_S:-360} CASES=${CASES:-lcpp1b_graphs,lcpp1b_nographs,server1b_np4,server8b_injected,server1b_kvq8,server8b} \
      bash benchmarks/llama_cpp.sh "$out" run
    ;;
  rest)
    JOBS=8 SETUP_WAIT=0 CHECK_PM=0 taskset -c 8-15 bash benchmarks/llama_cpp.sh "$out" setup 2>&1 | tail -n 8
    . benchmarks/device_setup.sh || exit 1
    export PATH=/usr/local/cuda/bin:$PATH
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u +%FT%TZ
    mkdir -p "$out/r"
    taskset -c 0-7 timeout ${COST_S:-230} $DM_PY benchmarks/cost.py "$out/r/cost" --engines manual --pairs 4 \
      --phase-s 3 --before-s 60 --after-s 60 --warm-s 30 > "$out/r/cost.log" 2>&1
    echo "cost.py exit $?"; tail -n 6 "$out/r/cost.log"
    taskset -c 0-7 timeout ${COUNTERS_S:-230} $DM_PY benchmarks/counters.py "$out/r/counters" --cases compiled8b_marks \
      > "$out/r/counters.log" 2>&1
    echo "counters.py exit $?"; tail -n 12 "$out/r/counters.log"
    freeze_check rest
    (cd "$out/r" && tar czf ../round_rest.tgz .) && rm -rf "$out/r"
    ;;
  last)
    . benchmarks/device_setup.sh || exit 1
    export PATH=/usr/local/cuda/bin:$PATH
    mkdir -p "$out/r"
    taskset -c 0-7 timeout 100 $DM_PY benchmarks/counters.py "$out/r/counters" --cases cuda_loop \
      > "$out/r/counters.log" 2>&1
    echo "counters.py exit $?"; tail -n 4 "$out/r/counters.log"
    taskset -c 0-7 timeout 190 $DM_PY benchmarks/unmodified.py "$out/r/unmodified" --cases compiled_8b_plain \
      --attaches 5 > "$out/r/unmodified.log" 2>&1
    echo "unmodified.py exit $?"; tail -n 8 "$out/r/unmodified.log"
    freeze_check last
    (cd "$out/r" && tar czf ../round_last.tgz .) && rm -rf "$out/r"
    LLAMA_S=${LLAMA_S:-280} CASES=${CASES:-server1b_kvq8} bash benchmarks/llama_cpp.sh "$out" run
    ;;
  first)
    . benchmarks/device_setup.sh || exit 1
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u +%FT%TZ; git log -1 --format=%h 2>/dev/null
    mkdir -p "$out/r"
    [ "${SMOKE:-0}" = 1 ] && bash -c "$(declare -f smoke); out=$out smoke"  # the demo engine, eager and graphed
    # each run: the model's load (~45 s on an H100), 40 s warm (at 20 s one loop of four still ran 35% slow), 30 s
    # before, the attach, 60 s after, 2 pairs of 4 phases of 3 s and the attaches' own seconds: ~230 s; a run cut
    # at COST_S stops its loop and judges what it has
    for i in $(seq ${FIRST_RUNS:-2}); do
      timeout ${COST_S:-270} $DM_PY benchmarks/cost.py "$out/r/first$i" --engines manual --pairs ${PAIRS:-2} --phase-s 3 \
        --before-s 30 --after-s 60 --warm-s 40 > "$out/r/first$i.log" 2>&1
      echo "cost.py $i exit $?"; tail -n 1 "$out/r/first$i.log"
      pkill -f manual_decode.py  # never a loop left beside the next one
      (cd "$out/r" && tar czf ../round_first.tgz .)  # what a call cut short at its limit still brings back
    done
    freeze_check first
    (cd "$out/r" && tar czf ../round_first.tgz .) && rm -rf "$out/r"
    ;;
  *) echo "no stage $stage: one, two, solo, rest, last or first"; exit 2 ;;
esac
