"""bat_jax's GRPO objective against verl's own functions (tests/verl_parity_check.py, in a process of its own).

Needs a verl source tree: ``BAT_JAX_VERL_SRC=/path/to/verl python -m pytest tests/test_verl_parity.py`` (a checkout's
root; verl itself need not be installed). Skipped without it. Measured at verl 9f18abe (2026-06-12, the last head
with ``main_ppo_sync``) and b178a3c (2026-01-29): values within 1.4e-7 relative, gradients within 6e-8 relative of
the largest, advantages within 5e-8, identical rejection decisions (docs/grpo.md, "The GRPO objective")."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from bat_jax.learn import objective

VERL = os.environ.get("BAT_JAX_VERL_SRC")
SCRIPT = pathlib.Path(__file__).with_name("verl_parity_check.py")


@pytest.mark.skipif(not VERL, reason="BAT_JAX_VERL_SRC (a verl source tree) is not set")
def test_objective_matches_verl_functions():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SCRIPT.parents[1]), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(SCRIPT), VERL], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    print(out)
    for mode in objective.LOSS_AGGREGATIONS:
        got = out["policy_loss"][mode]
        assert got["value_rel"] < 1e-6 and got["grad_rel"] < 1e-6, mode
        # verl before February 2026 summed seq-mean-token-sum-norm over the batch's 6 rows; since, the mean
        assert got["verl_factor"] in ((1.0, 6.0) if mode == "seq-mean-token-sum-norm" else (1.0,)), mode
    assert out["advantages"]["abs"] < 1e-6
    rc = out["rollout_correction"]
    assert rc["tis_abs"] < 1e-6 and rc["keep_differs"] == 0 and rc["rows_masked"] > 0 and rc["rows_compared"] > 50
