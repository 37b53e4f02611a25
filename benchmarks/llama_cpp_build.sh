#!/usr/bin/env bash
# llama-cpp-python's CUDA build for one GPU call: its PyPI sdist (76.6 MB, llama.cpp vendored) is over what a
# device call carries, so `strip` keeps what a CPU or CUDA build of the library and llama-server needs and repacks
# it; `build` makes the wheel from that, for one CUDA architecture (90: H100, H200) to fit inside one call;
# `server` builds llama.cpp's llama-server from the same source (no web UI: its metrics endpoint is what counts).
#
#   bash benchmarks/llama_cpp_build.sh strip llama_cpp_python-0.3.36.tar.gz .whl/llama_cpp_python-src.tar.gz
#   bash benchmarks/llama_cpp_build.sh build .whl/llama_cpp_python-src.tar.gz OUTDIR [cpu|cuda]
#   bash benchmarks/llama_cpp_build.sh server llama_cpp_python-0.3.36.tar.gz OUTDIR [cpu|cuda]
#   bash benchmarks/llama_cpp_build.sh once llama_cpp_python-0.3.36.tar.gz OUTDIR
#   bash benchmarks/llama_cpp_build.sh once-cuda .whl/llama_cpp_python-src.tar.gz OUTDIR
#   bash benchmarks/llama_cpp_build.sh inject OUTDIR
#
# `inject` builds decodemon's CUPTI injection library (probes/cupti_inject/) into OUTDIR with the C compiler,
# CUPTI's headers from the nvidia-cuda-cupti wheel and the CUDA toolkit's cuda.h: what `decodemon run --
# llama-server ...` loads through CUDA_INJECTION64_PATH (it builds the same library on first use by itself).
#
# `once` is the CPU build CI makes: one CMake build of llama.cpp's shared libraries and llama-server (OUTDIR/bin,
# each finding the libraries beside it), and llama-cpp-python as a Python-only wheel (OUTDIR/wheels) that loads
# those libraries (LLAMA_CPP_LIB_PATH=OUTDIR/bin): llama.cpp compiled once, not once for each. `once-cuda` is the
# same build with the CUDA backend for sm_90 alone (H100, H200), libraries and llama-server only: on the GPU
# machine, beside the Python-only wheel carried from a CPU machine (benchmarks/llama_cpp.sh setup). OUTDIR/bin
# appears, whole, only when the build is done.
#
# (`pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36` fetches the sdist.)
set -euo pipefail

# what no build of the library needs: model vocabularies, docs, tests, examples, the web UI, other backends
# (of the web UI only its CMake files stay: llama-server builds without its pages)
DROP=(models docs tests benches examples media gguf-py/tests tools/ui/src tools/ui/static tools/ui/tests
      tools/ui/scripts tools/ui/package-lock.json tools/mtmd/tests
      ggml/src/ggml-vulkan ggml/src/ggml-sycl ggml/src/ggml-metal ggml/src/ggml-opencl ggml/src/ggml-cann
      ggml/src/ggml-hexagon ggml/src/ggml-webgpu ggml/src/ggml-openvino ggml/src/ggml-et ggml/src/ggml-virtgpu
      ggml/src/ggml-musa ggml/src/ggml-zdnn ggml/src/ggml-kompute)

case "${1:-}" in
  strip)
    src=$2 out=$3
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    tar xzf "$src" -C "$tmp"
    top=$(ls "$tmp")
    for d in "${DROP[@]}"; do rm -rf "$tmp/$top/vendor/llama.cpp/$d"; done
    rm -rf "$tmp/$top/.git" "$tmp/$top/docs" "$tmp/$top/examples" "$tmp/$top/tests"  # .git: the vendored history
    tar czf "$out.part" -C "$tmp" "$top"
    mv "$out.part" "$out"
    echo "$out: $(du -h "$out" | cut -f1)"
    ;;
  build)
    src=$2 out=$3 kind=${4:-cuda}
    args="-DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF -DGGML_OPENMP=OFF"
    if [ "$kind" = cuda ]; then
      args="$args -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON"
    else
      args="$args -DGGML_AVX2=ON -DLLAMA_BUILD_TOOLS=OFF"
    fi
    CMAKE_ARGS="$args" CMAKE_BUILD_PARALLEL_LEVEL="${JOBS:-$(nproc)}" \
      python3 -m pip wheel -q --no-deps -w "$out" "$src"
    ls "$out"
    ;;
  server)
    src=$2 out=$3 kind=${4:-cpu}
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    tar xzf "$src" -C "$tmp"
    args=(-DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
          -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DGGML_OPENMP=OFF
          -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF)
    if [ "$kind" = cuda ]; then args+=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90); else args+=(-DGGML_AVX2=ON); fi
    cmake -S "$tmp"/*/vendor/llama.cpp -B "$tmp/build" "${args[@]}" >/dev/null
    cmake --build "$tmp/build" --target llama-server -j "${JOBS:-$(nproc)}" >/dev/null
    mkdir -p "$out"
    cp "$tmp/build/bin/llama-server" "$out/llama-server.part"
    mv "$out/llama-server.part" "$out/llama-server"
    echo "$out/llama-server"
    ;;
  once|once-cuda)
    src=$2 out=$3
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    tar xzf "$src" -C "$tmp"
    args=(-DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DLLAMA_BUILD_TESTS=OFF
          -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_CURL=OFF
          -DLLAMA_OPENSSL=OFF -DGGML_OPENMP=OFF -DBUILD_SHARED_LIBS=ON -DLLAMA_BUILD_UI=OFF
          -DLLAMA_USE_PREBUILT_UI=OFF '-DCMAKE_BUILD_RPATH=$ORIGIN')
    [ "$1" = once-cuda ] && args+=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90)
    # the configure's and the build's words only where they fail (both warn that the server has no web UI, which
    # no test uses)
    cmake -S "$tmp"/*/vendor/llama.cpp -B "$tmp/build" "${args[@]}" >"$tmp/configure.log" 2>&1 ||
      { cat "$tmp/configure.log" >&2; exit 1; }
    cmake --build "$tmp/build" --target llama llama-server -j "${JOBS:-$(nproc)}" >"$tmp/build.log" 2>&1 ||
      { tail -n 100 "$tmp/build.log" >&2; exit 1; }
    mkdir -p "$out/bin.part" "$out/wheels"
    cp -a "$tmp/build/bin/"*.so* "$tmp/build/bin/llama-server" "$out/bin.part/"
    [ "$1" = once ] && CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" python3 -m pip wheel -q --no-deps \
      -w "$out/wheels" "$src" >/dev/null
    rm -rf "$out/bin"
    mv "$out/bin.part" "$out/bin"
    ls "$out/bin" "$out/wheels"
    ;;
  inject)
    out=$2
    python3 -c 'import sys; from decodemon.monitor.inject.cupti_lib import build; print(build(sys.argv[1]))' "$out"
    ;;
  *)
    echo "usage: $0 strip SDIST OUT.tar.gz | build SRC.tar.gz OUTDIR [cpu|cuda] | server SRC.tar.gz OUTDIR [cpu|cuda]" \
         "| once SDIST OUTDIR | once-cuda SRC.tar.gz OUTDIR | inject OUTDIR" >&2
    exit 2
    ;;
esac
