#!/usr/bin/env bash
# The device check, as one run on a machine with an NVIDIA card (the `device` tool's machine):
# installs Berth's wheel and the dependencies that machine lacks from .whl/ (built beforehand:
# `pip wheel --no-deps .` and `pip download` of pydantic and the rest), then runs check_nvml.py
# and check_live.py, writing their figures and logs to $OUT. cuda-checkpoint is taken from
# .devtools/cuda-checkpoint when it is there (NVIDIA's binary, never committed), else PATH.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/berth-device-out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl || exit 3
ck=cuda-checkpoint; [ -x .devtools/cuda-checkpoint ] && ck=$PWD/.devtools/cuda-checkpoint
"$ck" --help 2>&1 | head -3
echo "== check_nvml"; timeout 120 python3 tests/device/check_nvml.py | tee "$OUT/check_nvml.json"
echo "== check_live"; timeout 360 python3 -m tests.device.check_live --out "$OUT" --checkpoint "$ck"
echo "check_live rc=$?"
