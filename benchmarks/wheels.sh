#!/usr/bin/env bash
# What a GPU call carries in .whl/ (gitignored; the device's `carry: [".whl"]`, 38 MiB of its 64 with the tree's 15): the cp312
# wheels of decodemon's own environment and of the helpers' /tmp/site (device_setup.sh), llama-cpp-python's sdist stripped to what a
# build needs, and llama-cpp-python as a Python-only wheel that loads the libraries the GPU call builds
# (LLAMA_CPP_LIB_PATH). Run once on a machine with PyPI, from the repository root:
#
#   bash benchmarks/wheels.sh
set -euo pipefail
mkdir -p .whl
plat=(--only-binary :all: --python-version 3.12 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux_2_24_x86_64 --platform manylinux_2_25_x86_64 --platform manylinux_2_28_x86_64)
python3 -m pip download -q --no-deps "${plat[@]}" -d .whl \
  "cupti-python==13.4.0" "nvidia-cuda-cupti==13.4.92" "cuda-pathfinder==1.9.1" "pyelftools==0.33" \
  "msgspec==0.23.0" "textual==8.2.8" "rich==15.0.0" "markdown-it-py==4.3.0" "mdit-py-plugins==0.7.0" \
  "linkify-it-py==2.2.0" "uc-micro-py==2.0.0" "platformdirs==4.14.9" "prometheus_client==0.26.0" \
  "gguf==0.19.0" "diskcache==5.6.3"
# the rest of decodemon's own environment (device_setup.sh installs it by the README's GPU line, --no-index from
# here), with what they need but numpy (the image's: its 16 MB wheel would not fit the carry), and setuptools to
# build decodemon from the clone
python3 -m pip download -q --no-deps "${plat[@]}" -d .whl "nvidia-ml-py==13.615.71" "pygments==2.21.0" \
  "mdurl==0.1.2" "typing_extensions>=4.12" "setuptools>=77" "msgspec==0.23.0" "textual==8.2.8" \
  "prometheus_client==0.26.0" "cupti-python==13.4.0" "nvidia-cuda-cupti==13.4.92" "cuda-bindings==13.5.0"
src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
python3 -m pip download -q --no-deps --no-binary :all: -d "$src" "llama-cpp-python==0.3.36"
bash benchmarks/llama_cpp_build.sh strip "$src"/llama_cpp_python-0.3.36.tar.gz .whl/llama_cpp_python-src.tar.gz
# the Python-only wheel: no llama.cpp compiled into it (the GPU call builds the libraries)
CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" python3 -m pip wheel -q --no-deps -w .whl \
  "$src"/llama_cpp_python-0.3.36.tar.gz
du -sh .whl
