#!/usr/bin/env bash
# Make .whl/: the wheels a GPU device machine needs for kvcheck's sglang stage.
#
# The device machine (one H200) has no network. Its image has Python 3.12, a CUDA torch
# 2.11, Triton, transformers/tokenizers/huggingface-hub, aiohttp, numpy, pillow, psutil,
# requests, pytest, pytest-xdist and hypothesis, but not sglang nor the rest of what
# sglang 0.5.23's pool, configurator and server-argument modules import (the list in
# /work/.library/device/KINDS.md; the imports were read off sys.modules after kvcheck's
# sglang target imported those modules). This script downloads exactly those wheels,
# pinned, for CPython 3.12 manylinux x86_64, into .whl/ (ignored by git), prints the
# total size and fails if it is over the device tool's 64 MiB limit for everything that
# travels (the working tree counts too, so keep well under it).
#
# Not carried: triton and torch (the image's CUDA builds must stay), sgl_kernel /
# sglang-kernel (a CUDA wheel far over the limit; scripts/gpu_check.py puts an import
# stand-in on the path for the sglang stage whose every call raises, so any pool path
# that really needs it fails loudly), flash-attn (gpu_check.py falls back to torch's
# flash SDPA backend).
#
# Usage:  bash scripts/fetch_gpu_wheels.sh       (from anywhere; rebuilds .whl/ from scratch)
# Env:    PYTHON  interpreter whose pip downloads (default python3)
#
# Then, on a task that is lent a device, ONE device `run` call, with carry [".whl"] and
# timeout_s 600 (the script keeps itself within 8 minutes):
#
#   set -o pipefail; python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit; PYTHONUNBUFFERED=1 python3 scripts/gpu_check.py --device cuda --out "$OUT" 2>&1 | tee "$OUT/gpu_check.log"
#
# It writes $OUT/gpu_check.json, $OUT/gpu_check.md and $OUT/gpu_check.log; copy the
# figures into docs/gpu-report.md. The run takes at most 8 minutes of the session's 15
# (machine start included), so a rerun names only the stages to repeat, e.g.
# `... scripts/gpu_check.py --device cuda --only suite-sglang --out "$OUT" ...`.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
DEST=.whl
LIMIT_BYTES=$((64 * 1024 * 1024))

# name==version; versions are those installed beside sglang 0.5.23 by
# scripts/install_sglang.sh, except where that version has no CPython 3.12 wheel.
WHEELS=(
  sglang==0.5.23
  transformers==5.19.0          # sglang pins it; the image has 5.17
  apache-tvm-ffi==0.1.11
  compressed-tensors==0.18.0
  gguf==0.19.0
  dill==0.4.1
  loguru==0.7.3
  msgspec==0.23.0
  orjson==3.10.18               # 3.8.3 (install_sglang.sh's pin) has no cp312 wheel
  pybase64==1.5.1
  pydantic==2.13.4
  pydantic-core==2.46.4
  annotated-types==0.8.0
  typing-inspection==0.4.5
  pyzmq==27.3.0
  starlette==1.10.0
  sniffio==1.3.1
  ipython==8.12.3               # without jedi/parso (5 MiB): IPython imports without them
  asttokens==3.0.2
  backcall==0.2.0
  decorator==5.3.1
  executing==2.3.0
  pexpect==4.9.0
  pickleshare==0.7.5
  prompt-toolkit==3.0.53
  ptyprocess==0.7.0
  pure-eval==0.2.4
  stack-data==0.6.3
  traitlets==5.16.1
  wcwidth==0.9.4
)

rm -rf "$DEST"
mkdir -p "$DEST"
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux_2_31_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_35_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any \
  -d "$DEST" "${WHEELS[@]}"

# One version of each: two would stop the device's install.
count=$(ls "$DEST"/*.whl | wc -l)
[ "$count" -eq "${#WHEELS[@]}" ] || {
  echo "fetch_gpu_wheels: expected ${#WHEELS[@]} wheels, found $count" >&2
  exit 1
}
sha256sum "$DEST"/*.whl | sed "s|$DEST/||" > "$DEST/SHA256SUMS"
wheels=$(du -cb "$DEST"/* | tail -1 | cut -f1)
# The working tree travels with the wheels and shares the limit.
tree=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | grep total$ | awk '{s += $1} END {print s + 0}')
mib() { awk -v b="$1" 'BEGIN {printf "%.1f", b / 1048576}'; }
echo "fetch_gpu_wheels: $count wheels, $(mib "$wheels") MiB in $DEST/;" \
  "with the tracked tree ($(mib "$tree") MiB) $(mib $((wheels + tree))) MiB of the 64 MiB limit"
if [ $((wheels + tree)) -gt "$LIMIT_BYTES" ]; then
  echo "fetch_gpu_wheels: over the 64 MiB the device tool carries" >&2
  exit 1
fi
