#!/usr/bin/env bash
# Run on the H200 device machine from the repo root: installs carried wheels, then a script.
#   bash scripts/h200.sh scripts/h200_capture.py
set -u
source scripts/h200_setup.sh
script=$1; shift
python3 "$script" "${OUT:-out}" "$@"
