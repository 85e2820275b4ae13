#!/usr/bin/env bash
# The GPU path in one prepared check (<= 8 minutes on one H100/H200-class GPU, compiles included), on a box as it
# comes: its own CUDA JAX, flax, optax, orbax, transformers, numpy and torch, no vLLM, no network. Never part of CI
# on a GPU; CI runs it with --tiny on a CPU through the same wheel-folder path (tests/test_box_stack.py).
#
#   bash launch/build_wheelhouse.sh build/wheelhouse   # on a networked machine: the pure-Python wheels a box lacks
#   bash launch/gpu_smoke.sh                            # on the GPU box (build/wheelhouse carried with the tree)
#   bash launch/gpu_smoke.sh --tiny                     # every stage's code on a CPU, tiny shapes
#   WHEELS=/path/to/wheels SEQ=2048 STEPS=2 bash launch/gpu_smoke.sh
#
# 1. nvidia-smi, then what this interpreter lacks of launch/constraints/box-wheels.txt is installed from $WHEELS
#    with `pip --no-index --target $SITE` (nothing is fetched; nothing outside $SITE changes);
# 2. python -m launch.bench.gpu_smoke (from the repository root): versions (a version outside pyproject's range is a warning, not a stop), then the
#    memory / sft / grpo / orbax / lora / sampler / vllm / replicas stages, one "[smoke] <stage> ok|skipped ..." line each,
#    then one table of every figure; the first failure exits non-zero.
set -euo pipefail

PY=${PYTHON:-python3}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WHEELS=${WHEELS:-$REPO/build/wheelhouse}
SITE=${SITE:-$REPO/build/smoke-site}
SEQ=${SEQ:-4096}
STEPS=${STEPS:-3}
EXTRA=()
TINY=0
for arg in "$@"; do
  case "$arg" in
    --tiny) EXTRA+=(--tiny); TINY=1 ;;
    *) echo "gpu_smoke.sh: unknown option $arg (known: --tiny)" >&2; exit 2 ;;
  esac
done
# 470 s on a GPU (the 8-minute budget); --tiny on a shared CPU compiles every stage's programs on two cores
if [ "$TINY" = 1 ]; then LIMIT_S=${LIMIT_S:-800}; else LIMIT_S=${LIMIT_S:-470}; fi

if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader | sed 's/^/[smoke] gpu: /' || true
fi

# what the box lacks, from the wheel folder only (one line per package: its import name and its requirement)
missing=()
while read -r module requirement; do
  case "$module" in ''|'#'*) continue ;; esac
  # from / and with -P: the repository's gin/ folder of run files must not pass for the gin package
  if ! (cd / && PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" "$PY" -P -c "import $module" >/dev/null 2>&1); then
    missing+=("$requirement")
  fi
done < "$REPO/launch/constraints/box-wheels.txt"
if [ "${#missing[@]}" -gt 0 ]; then
  if [ ! -d "$WHEELS" ]; then
    echo "[smoke] missing ${missing[*]} and no wheel folder at $WHEELS (bash launch/build_wheelhouse.sh on a" \
         "networked machine, then bring the folder here)" >&2
    exit 1
  fi
  echo "[smoke] installing ${missing[*]} from $WHEELS into $SITE (no index)"
  "$PY" -m pip install --disable-pip-version-check -q --no-index --find-links "$WHEELS" --no-deps \
    --target "$SITE" --upgrade "${missing[@]}"
fi
export PYTHONPATH="$SITE:$REPO${PYTHONPATH:+:$PYTHONPATH}"

cd "$REPO"
# vLLM and JAX share the GPU in one process: leave vLLM its 0.3 (as gin/bicurl_9b.gin does)
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.6}
timeout "$LIMIT_S" "$PY" -m launch.bench.gpu_smoke --seq "$SEQ" --steps "$STEPS" "${EXTRA[@]}"
echo "[smoke] all stages passed"
