"""`launch/bench/gpu_smoke.py --tiny` on CPU: the sampler stage (JAX sampler, continuous batching, prefix cache)
runs and reports its figures, the replicas stage skips with its reason, and the closing table holds every figure.
(The whole smoke through `launch/gpu_smoke.sh --tiny` on the box stack: tests/test_box_stack.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_tiny_smoke_runs_the_sampler_stage_on_cpu():
    out = subprocess.run([sys.executable, str(REPO / "launch" / "bench" / "gpu_smoke.py"), "--tiny", "--seq", "64",
                          "--stages", "sampler,replicas"], capture_output=True, text=True, timeout=900,
                         env={**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = {ln.split()[1]: ln for ln in out.stdout.splitlines() if ln.startswith("[smoke] ") and len(ln.split()) > 2}
    sampler = dict(kv.split("=", 1) for kv in lines["sampler"].split()[5:])
    assert lines["sampler"].split()[2] == "ok"
    assert sampler["rows"] == "4" and sampler["prefix_hits"] == "4"  # every second turn continued a stored row
    assert float(sampler["prefill_tokens_per_s"]) > 0 and float(sampler["decode_tokens_per_s"]) > 0
    assert lines["replicas"].split()[2] == "skipped"
    table = [ln for ln in out.stdout.splitlines() if ln.startswith("[smoke] | sampler |")]
    assert "[smoke] | sampler | prefix_hits | 4 |" in table and len(table) == 2 + len(sampler)
