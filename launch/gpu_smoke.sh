#!/usr/bin/env bash
# One prepared check of the GPU path, <= 8 minutes on one lent GPU (issue 14). UNTESTED: written without a GPU.
# Never part of CI. Run after `bash launch/install_gpu.sh`:
#
#   bash launch/gpu_smoke.sh                 # all stages, 4,096-token rows
#   SEQ=2048 STEPS=2 bash launch/gpu_smoke.sh
#
# 1. versions first (jax / jaxlib / CUDA plugin / torch / vllm) and that JAX sees the GPU;
# 2. launch/bench/gpu_smoke.py: a Qwen3.5-0.8B-shaped random model in bf16 with the real vocabulary — SFT step,
#    GRPO step (tokens/s, MFU), Orbax save/restore, and the vLLM stages where vLLM is installed.
# Each stage prints one "[smoke] <stage> ok ..." line; the script exits non-zero at the first failure.
set -euo pipefail

PY=${PYTHON:-python}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SEQ=${SEQ:-4096}
STEPS=${STEPS:-3}
LIMIT_S=${LIMIT_S:-470}

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader \
  | sed 's/^/[smoke] gpu: /'
"$PY" - <<'PYEOF'
import importlib.metadata as md
vers = {}
for name in ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda12-plugin", "flax", "optax", "orbax-checkpoint", "torch",
             "vllm", "transformers", "numpy"):
    try:
        vers[name] = md.version(name)
    except md.PackageNotFoundError:
        pass
print("[smoke] versions: " + ", ".join(f"{k} {v}" for k, v in vers.items()))
import jax
if jax.default_backend() != "gpu":
    raise SystemExit(f"[smoke] JAX backend is {jax.default_backend()!r}, not 'gpu': bash launch/install_gpu.sh")
if vers.get("jax") != "0.10.2":
    raise SystemExit(f"[smoke] jax {vers.get('jax')} != 0.10.2 (pyproject pin)")
PYEOF

cd "$REPO"
# vLLM and JAX share the GPU in one process: leave vLLM its 0.3 (as gin/bicurl_9b.gin does)
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.6}
timeout "$LIMIT_S" "$PY" launch/bench/gpu_smoke.py --seq "$SEQ" --steps "$STEPS"
echo "[smoke] all stages passed"
