"""The vLLM replica's entry point (bat_jax/rollout/vllm_replica_worker.py) imports without JAX."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_replica_entry_point_imports_without_jax():
    """With `jax` blocked (an import of it raises), the replica's entry point and everything it loads import."""
    code = ("import sys; sys.modules['jax'] = None; sys.modules['flax'] = None\n"
            "import bat_jax.rollout.vllm_replica_worker as w, bat_jax.rollout.engine, bat_jax.rollout.sync_staging\n"
            "import bat_jax.rollout.inflight\n"
            "assert callable(w.serve)\n"
            "import importlib.util\n"
            "if importlib.util.find_spec('vllm') is not None:\n"
            "    import bat_jax.rollout.vllm_engine as e; assert e.VLLMEngineConfig(model_dir='x').dtype == 'float32'\n"
            "print('jax-free', sys.modules['jax'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("jax-free None")
