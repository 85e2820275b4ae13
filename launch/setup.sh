#!/usr/bin/env bash
# One-shot, idempotent set-up of a fresh machine for bat_jax: Python packages (with the test extra),
# the Docker engine (docker.io + debootstrap, dockerd started in the background when not running) and the
# sandbox images (built from Debian packages; skipped when the content-addressed tag already exists).
#
#   bash launch/setup.sh            # everything
#   SKIP_DOCKER=1 bash launch/setup.sh   # Python packages only
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python}
echo "[setup] python packages"
"$PY" -m pip install --disable-pip-version-check -q -e ".[test]"

if [ "${SKIP_DOCKER:-0}" != "1" ]; then
  echo "[setup] docker engine"
  bash launch/start_dockerd.sh
  echo "[setup] sandbox images"
  PYTHON="$PY" bash launch/build_images.sh
fi
echo "[setup] done"
