"""The environment of a JAX process a test starts on CPU (test_multihost, test_distributed)."""

import os
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[2]
# The session's persistent compilation cache (tests/conftest.py): a started process reads the programs compiled
# before it instead of compiling them again.
_KEPT = ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS")
# XLA's CPU backend without LLVM's optimisations (tests/conftest.py): the tests' small programs compile in about three
# quarters of the CPU time. The processes that run many steps (the multi-process runs of `cpu_process_env`, the
# guide's command) run without it: their programs would run slower (docs/measurements.md, test suite time).
FAST_COMPILE = "--xla_backend_optimization_level=0"


def without_fast_compile(env: dict[str, str]) -> dict[str, str]:
    """`env` with :data:`FAST_COMPILE` taken out of its XLA_FLAGS (a run as a user starts it)."""
    flags = " ".join(f for f in env.get("XLA_FLAGS", "").split() if f != FAST_COMPILE)
    return {**{k: v for k, v in env.items() if k != "XLA_FLAGS"}, **({"XLA_FLAGS": flags} if flags else {})}


def cpu_process_env(devices: int, **extra: str) -> dict[str, str]:
    """This process's environment for a child on `devices` CPU devices, this repository on its path.

    Every other `JAX_*` / `XLA_*` variable (platform, device count, a coordinator) is dropped; `extra` is added last.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_")) or k in _KEPT}
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.update(extra)
    return env
