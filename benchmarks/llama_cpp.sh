# llama.cpp on one GPU (benchmarks/llama_cpp_gpu.py), in two stages that each fit one call of the device, one right
# after the other (the machine stays warm 30 s after a call):
#
#   bash benchmarks/llama_cpp.sh OUTDIR setup   installs the wheels (device_setup.sh) and starts, detached, llama.cpp's
#                                               CUDA build for sm_90 (llama_cpp_build.sh once-cuda, from the stripped
#                                               sdist in .whl/) and the random-weight f16 GGUFs of llama-1b and
#                                               llama-8b; checks the reference PM reader and decodemon's injection
#                                               library; returns within ~3 minutes, the build still going
#   bash benchmarks/llama_cpp.sh OUTDIR run     waits for what setup started, then the cases of llama_cpp_gpu.py in
#                                               order, as far as ~9 minutes go (CASES=a,b picks some)
#
# Run from the repository root with .whl/ carried (made by `bash benchmarks/wheels.sh`): the cp312 wheels (device_setup.sh), the Python-only
# llama-cpp-python wheel and the stripped sdist llama_cpp_python-src.tar.gz. What setup starts lives under
# /tmp/dm_llama: cuda/bin (whole only when built), build.log, llama-1b.gguf, llama-8b.gguf, and NAME.rc as each
# finishes (its exit status and time). Each stage prints the device, driver, date and commit first, and its table
# last; `run` leaves OUTDIR/llama_cpp.md and .json, llama_cpp.tgz (JSON and logs) and recordings.tgz.
set -uo pipefail
out=${1:?OUTDIR}
stage=${2:?setup or run}
mkdir -p "$out"
export work=/tmp/dm_llama
. benchmarks/device_setup.sh || exit 1
export PATH=/usr/local/cuda/bin:$PATH
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader
date -u +%FT%TZ
echo "commit ${COMMIT:-unknown}"
case "$stage" in
  setup)
    mkdir -p "$work"
    started() { date -u +%T > "$work/$1.started"; }
    done_rc() { echo "$1 $(date -u +%T)" > "$work/$2.rc"; }
    export -f done_rc
    started build
    JOBS=${JOBS:-$(nproc)} setsid nohup bash -c 'bash benchmarks/llama_cpp_build.sh once-cuda \
      .whl/llama_cpp_python-src.tar.gz /tmp/dm_llama/cuda; done_rc $? build' >"$work/build.log" 2>&1 </dev/null &
    for shape in llama-1b llama-8b; do
      started "$shape"
      PYTHONPATH=$TOOLS_PATH setsid nohup bash -c 'python3 -c "import sys; sys.path.insert(0, \"benchmarks/loops\"); from llama_cpp_decode \
import write_gguf; write_gguf(sys.argv[1], sys.argv[2])" "$0" "$1"; done_rc $? "$1"' "$work/$shape.gguf" "$shape" \
        >"$work/$shape.log" 2>&1 </dev/null &
    done
    # what can fail early, while those run: the reference reader on an idle GPU, the injection library, the wheel
    [ "${CHECK_PM:-1}" = 1 ] && echo 1 | PYTHONPATH=$TOOLS_PATH timeout 60 $ENGINE_PY benchmarks/llama_cpp_gpu.py --pm-reader | tail -1
    timeout 60 $DM_PY -c 'from decodemon.monitor.inject.cupti_lib import build; print("injection library", build())' \
      2>&1 | tail -2
    $ENGINE_PY -c 'import importlib.metadata as m; print("llama-cpp-python", m.version("llama-cpp-python"))' 2>&1 | tail -1
    for i in $(seq ${SETUP_WAIT:-100}); do
      [ -f "$work/build.rc" ] && [ -f "$work/llama-8b.rc" ] && break
      sleep 1
    done
    for f in build llama-1b llama-8b; do
      echo "$f: started $(cat "$work/$f.started"), $( [ -f "$work/$f.rc" ] && echo "done (rc, at) $(cat "$work/$f.rc")" || echo running)"
    done
    tail -n 3 "$work/build.log"
    tail -n 60 "$work/build.log" > "$out/build.log.tail"
    ;;
  run)
    timeout ${LLAMA_S:-545} $DM_PY benchmarks/llama_cpp_gpu.py "$out/llama_cpp" --cases "${CASES:-lcpp1b_graphs,lcpp1b_nographs,server8b,server8b_injected,server1b_np4,server1b_kvq8,lcpp8b_graphs,lcpp8b_nographs}" \
      > "$out/run.log" 2>&1
    echo "llama_cpp_gpu.py exit $?"
    grep '^\[' "$out/run.log" | cut -c1-160
    for f in build llama-1b llama-8b; do [ -f "$work/$f.rc" ] && echo "$f: rc, at $(cat "$work/$f.rc")"; done
    [ "$(cut -d' ' -f1 "$work/build.rc" 2>/dev/null)" = 0 ] || tail -n 15 "$work/build.log"
    tail -n 60 "$work/build.log" > "$out/llama_cpp/build.log.tail" 2>/dev/null
    mv "$out/run.log" "$out/llama_cpp/"
    # what comes back from a device is at most 8 files of 16 MB: the table, the summary, the recordings and the rest
    cp "$out/llama_cpp/llama_cpp.md" "$out/llama_cpp/llama_cpp.json" "$out/" 2>/dev/null
    (cd "$out/llama_cpp" && tar czf ../recordings.tgz $(ls *.dmon 2>/dev/null) 2>/dev/null; \
     tar czf ../llama_cpp.tgz --exclude='*.dmon' .) && rm -rf "$out/llama_cpp"
    if [ "$(stat -c %s "$out/recordings.tgz" 2>/dev/null || echo 0)" -gt 15000000 ]; then
      (cd "$out" && split -b 15000000 -d recordings.tgz recordings.tgz.part && rm recordings.tgz)
    fi
    ls -la "$out"
    cat "$out/llama_cpp.md" 2>/dev/null
    ;;
  *) echo "no stage $stage: setup or run"; exit 2 ;;
esac
