"""The test session's setup (tests/conftest.py): 8 fake CPU devices, XLA without LLVM's optimisations, one persistent
compilation cache shared with the processes tests start, and reports that list the slowest tests."""

import os
import pathlib
import subprocess
import sys
import tomllib

import jax
import numpy as np

from doubles import cpu_process_env
from doubles.processes import FAST_COMPILE, without_fast_compile

REPO = pathlib.Path(__file__).resolve().parents[1]
# The same program in this session and in a child process: x * 3 + 1, summed cumulatively.
PROGRAM = """
import jax, jax.numpy as jnp
def triple_cumsum(x):
    return jnp.cumsum(x * 3.0 + 1.0)
"""


def test_eight_fake_cpu_devices():
    assert jax.device_count() == 8
    assert all(d.platform == "cpu" for d in jax.devices())


def test_a_started_process_reads_the_program_the_session_compiled(tmp_path):
    """The session writes what it compiles to `JAX_COMPILATION_CACHE_DIR`; a process a test starts (a launch run, a
    multihost worker, in `doubles.cpu_process_env`) inherits the folder and, with the session's XLA flags (a launch
    run inherits them), reads the program back instead of compiling it."""
    cache = pathlib.Path(os.environ["JAX_COMPILATION_CACHE_DIR"])
    assert jax.config.jax_compilation_cache_dir == str(cache)
    scope = {}
    exec(PROGRAM, scope)
    x = np.arange(5, dtype=np.float32)
    np.testing.assert_allclose(jax.jit(scope["triple_cumsum"])(x), np.cumsum(x * 3 + 1), rtol=1e-6)

    child = PROGRAM + f"""
import numpy as np
events = []
jax.monitoring.register_event_listener(lambda event, **_: events.append(event))
x = np.array({x.tolist()}, dtype=np.float32)
assert np.allclose(jax.jit(triple_cumsum)(x), np.cumsum(x * 3 + 1), rtol=1e-6)
print(events.count("/jax/compilation_cache/cache_hits"), events.count("/jax/compilation_cache/cache_misses"))
"""
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env=cpu_process_env(8, XLA_FLAGS=os.environ["XLA_FLAGS"]))
    assert done.returncode == 0, done.stderr[-3000:]
    hits, misses = map(int, done.stdout.split())
    assert (hits, misses) == (1, 0)  # [1, 5, 12, 22, 35] without compiling


def test_the_session_compiles_fast_and_the_multi_step_processes_run_optimised():
    """The session's flags carry FAST_COMPILE; a multi-process worker's (`cpu_process_env`) and the guide's
    (`without_fast_compile`) do not, and keep every other variable and flag."""
    assert FAST_COMPILE in os.environ["XLA_FLAGS"].split()
    assert cpu_process_env(2)["XLA_FLAGS"] == "--xla_force_host_platform_device_count=2"
    env = {"XLA_FLAGS": f"--xla_force_host_platform_device_count=8 {FAST_COMPILE}", "PATH": "/bin"}
    assert without_fast_compile(env) == {"XLA_FLAGS": "--xla_force_host_platform_device_count=8", "PATH": "/bin"}
    assert without_fast_compile({"XLA_FLAGS": FAST_COMPILE}) == {}


def test_reports_list_the_twenty_slowest_tests():
    """CI's log names the slowest tests (`.ci/run` runs `python -m pytest -n 2 --dist=loadgroup tests`), so the budget's trend shows."""
    addopts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["addopts"]
    assert "--durations=20" in addopts.split()
