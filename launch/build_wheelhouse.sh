#!/usr/bin/env bash
# On a networked machine: downloads the pure-Python wheels of launch/constraints/box-wheels.txt (what an offline GPU
# box lacks for launch/gpu_smoke.sh) into one folder, for the box's Python version and platform. A few hundred kB
# to a few MB; nothing is installed here.
#
#   bash launch/build_wheelhouse.sh [OUT]            # default OUT: build/wheelhouse; Python 3.12, manylinux x86_64
#   PY_VERSION=3.11 PLATFORM=manylinux_2_28_aarch64 bash launch/build_wheelhouse.sh /tmp/wheels
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${1:-$REPO/build/wheelhouse}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
mapfile -t reqs < <(grep -v '^\s*\(#\|$\)' "$REPO/launch/constraints/box-wheels.txt" | awk '{print $2}')
"$PY" -m pip download --disable-pip-version-check -q --no-deps --only-binary=:all: \
  --python-version "${PY_VERSION:-3.12}" --platform "${PLATFORM:-manylinux_2_28_x86_64}" -d "$OUT" "${reqs[@]}"
echo "[wheelhouse] $(ls "$OUT" | wc -l) wheels, $(du -sh "$OUT" | cut -f1) in $OUT"
