"""bat_jax on other stacks than the pinned one, without a GPU: Python 3.12 environments with

- `box`: the lent GPU box's package set (`launch/constraints/box.txt`: jax 0.11.2, flax 0.12.12, transformers 5.17,
  numpy 2.5.2; no gin, docker, nibabel, tensorboardX, vLLM or torch), where `launch/gpu_smoke.sh --tiny` runs as on
  an offline box — what the environment lacks comes from a wheel folder built by `launch/build_wheelhouse.sh`,
  installed with `pip --no-index --target`; every stage passes and vLLM's is skipped;
- `newest`: the newest JAX the index offers (`launch/constraints/newest.txt`);

and in each the sampler / learner / checkpoint tests pass a second time (`CORE_TESTS`: each code path once, the
sampler's tests on Qwen3.5 only). Each environment is built once per
constraints file under `build/<stack>-venv` (a few minutes; reused while the file is unchanged). Slow: it needs the
package index.
"""

from __future__ import annotations

import glob
import hashlib
import os
import pathlib
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

pytestmark = pytest.mark.slow

REPO = pathlib.Path(__file__).resolve().parents[1]
CONSTRAINTS = REPO / "launch" / "constraints"
# The JAX code paths a run takes, on each stack once (a canary for API drift; the full files run on the pinned stack):
# the sampler (plain, and on the box continuously batched), the learner (its SFT and GRPO blocks, sharded steps), the
# GRPO loss and checkpoints, without the slow cases, and one parameter of tests that repeat a path (the Qwen3.5
# sampler covers its attention layers and Gated DeltaNet; one loss aggregation). On the box's stack the GPU smoke
# (`launch/gpu_smoke.sh --tiny`, below) runs SFT, GRPO, Orbax, LoRA and the sampler end to end besides.
# The transformers-parity tests need torch, which these stacks lack.
CORE_TESTS = {
    "box": ("test_jax_sampler.py", "test_continuous_batching.py", "test_learner.py", "test_grpo.py",
            "test_checkpoint.py"),
    "newest": ("test_jax_sampler.py", "test_learner.py", "test_grpo.py", "test_checkpoint.py"),
}
SELECT = {"box": "not docker and not vllm and not slow", "newest": "not docker and not vllm and not slow"}
_ONE_FAMILY = (  # the Qwen3.5 case of each sampler test covers its attention layers and Gated DeltaNet
    "test_jax_sampler.py::test_step_buckets_and_last_only_prefill_give_the_same_completions[qwen3]",
    "test_jax_sampler.py::test_learner_reproduces_sampled_logprobs[qwen3]",
)
_ONE_AGGREGATION = ("test_learner.py::test_chunked_head_entropy_and_micro_batched_gradients_are_exact"
                    "[seq-mean-token-mean]",)
DESELECT = {"box": (*_ONE_FAMILY, *_ONE_AGGREGATION,
                    "test_continuous_batching.py::test_rows_joining_a_running_batch_sample_what_generate_samples[qwen3]",
                    "test_continuous_batching.py::test_next_turn_continues_the_stored_state[qwen3]"),
            "newest": (*_ONE_FAMILY, *_ONE_AGGREGATION)}


def _python312() -> str:
    for exe in [shutil.which("python3.12"), *sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.12*/bin/python")))]:
        if exe and subprocess.run([exe, "-c", "import venv"], capture_output=True).returncode == 0:
            return exe
    pytest.fail("no Python 3.12 interpreter (python3.12 on PATH or under ~/.pyenv/versions): these stacks need one")


def stack_python(stack: str) -> pathlib.Path:
    """The interpreter of `build/<stack>-venv`, (re)built when `launch/constraints/<stack>.txt` changed since."""
    requirements = CONSTRAINTS / f"{stack}.txt"
    venv = REPO / "build" / f"{stack}-venv"
    stamp = venv / "constraints.sha256"
    digest = hashlib.sha256(requirements.read_bytes() + (CONSTRAINTS / "pip.txt").read_bytes()).hexdigest()
    python = venv / "bin" / "python"
    if python.exists() and stamp.exists() and stamp.read_text() == digest:
        return python
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([_python312(), "-m", "venv", str(venv)], check=True)
    done = subprocess.run([str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", "-r",
                           str(CONSTRAINTS / "pip.txt")], capture_output=True, text=True)  # the tests' pip first
    if done.returncode == 0:
        done = subprocess.run([str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", "-r",
                               str(requirements)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    stamp.write_text(digest)
    return python


@pytest.fixture(scope="module")
def stacks() -> dict[str, pathlib.Path]:
    """Each stack's interpreter, the environments built side by side (pip mostly waits on the index)."""
    names = ("box", "newest")
    with ThreadPoolExecutor(len(names)) as pool:
        return dict(zip(names, pool.map(stack_python, names)))


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "XLA_FLAGS")}
    env["JAX_PLATFORMS"] = "cpu"
    return env


def test_gpu_smoke_runs_on_the_box_stack_from_a_wheel_folder(stacks, tmp_path):
    python, env = stacks["box"], _env()
    missing = subprocess.run([str(python), "-P", "-c", "import gin"], capture_output=True, env=env, cwd=tmp_path)
    assert missing.returncode != 0, "the box stack must lack gin-config, as the box does"

    wheels = tmp_path / "wheels"
    built = subprocess.run(["bash", str(REPO / "launch" / "build_wheelhouse.sh"), str(wheels)], capture_output=True,
                           text=True, env=env)
    assert built.returncode == 0, built.stderr[-3000:]
    assert all(p.name.endswith("-py3-none-any.whl") for p in wheels.iterdir())  # pure Python only

    site = tmp_path / "site"
    smoke = subprocess.run(["bash", str(REPO / "launch" / "gpu_smoke.sh"), "--tiny"], capture_output=True, text=True,
                           env={**env, "PYTHON": str(python), "WHEELS": str(wheels), "SITE": str(site)}, timeout=900)
    print(smoke.stdout)
    assert smoke.returncode == 0, smoke.stdout[-3000:] + smoke.stderr[-3000:]
    lines = {ln.split()[1]: ln for ln in smoke.stdout.splitlines() if ln.startswith("[smoke] ") and len(ln.split()) > 2}
    assert f"from {wheels} into {site}" in lines["installing"]  # the wheel-folder path ran
    for stage in ("memory", "sft", "grpo", "orbax", "lora", "sampler"):
        assert lines[stage].split()[2] == "ok", lines[stage]
    assert lines["vllm"].split()[2] == "skipped" and "vllm_not_installed" in lines["vllm"]
    assert lines["replicas"].split()[2] == "skipped" and "[smoke] | sampler | prefix_hits |" in smoke.stdout
    assert "jax 0.11.2" in lines["versions:"] and "python 3.12" in lines["versions:"]
    assert sorted(p.name.split("-")[0].lower() for p in site.glob("*.dist-info")) == [
        "docker", "gin_config", "nibabel", "tensorboardx"]


@pytest.mark.parametrize("stack", ["box", "newest"])
def test_core_tests_pass_on_another_stack(stacks, stack, tmp_path):
    python, env = stacks[stack], _env()
    site = tmp_path / "site"  # what the stack lacks, as the smoke installs it (from the index here)
    wheel_list = [ln.split()[1] for ln in (CONSTRAINTS / "box-wheels.txt").read_text().splitlines()
                  if ln.strip() and not ln.startswith("#")]
    got = subprocess.run([str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", "--no-deps",
                          "--target", str(site), *wheel_list], capture_output=True, text=True, env=env)
    assert got.returncode == 0, got.stderr[-3000:]
    version = subprocess.run([str(python), "-c", "import jax; print(jax.__version__)"], capture_output=True,
                             text=True, env=env, cwd=tmp_path).stdout.strip()
    pinned = next(ln for ln in (CONSTRAINTS / f"{stack}.txt").read_text().splitlines() if ln.startswith("jax=="))
    assert version == pinned.split("==")[1]
    tests = subprocess.run([str(python), "-m", "pytest", *[f"tests/{t}" for t in CORE_TESTS[stack]], "-q", "-p",
                            "no:cacheprovider", "-m", SELECT[stack],
                            *[f"--deselect=tests/{t}" for t in DESELECT[stack]]], cwd=REPO, capture_output=True,
                           text=True, env={**env, "PYTHONPATH": f"{site}{os.pathsep}{REPO}"}, timeout=2400)
    print(f"jax {version}: {tests.stdout.splitlines()[-1] if tests.stdout else ''}")
    assert tests.returncode == 0, tests.stdout[-4000:] + tests.stderr[-2000:]
    assert " passed" in tests.stdout.splitlines()[-1] and "skipped" not in tests.stdout.splitlines()[-1]


def test_box_constraints_leave_out_what_the_wheel_folder_brings():
    """The box stack lacks exactly what the wheel list brings (the slow test then shows the list is enough)."""
    box = {ln.split("==")[0].strip().lower() for ln in (CONSTRAINTS / "box.txt").read_text().splitlines()
           if ln and not ln.startswith("#")}
    wheels = [ln.split() for ln in (CONSTRAINTS / "box-wheels.txt").read_text().splitlines()
              if ln.strip() and not ln.startswith("#")]
    names = {req.split("==")[0].lower() for _, req in wheels}
    assert names == {"gin-config", "docker", "nibabel", "tensorboardx"} and not names & box
