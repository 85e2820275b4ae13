"""Configuration errors in one line: what a user fixes by changing a binding or a path prints one `[bat_jax] error:`
line naming it and exits 2 (`bat_jax/errors.py`); `--debug` shows the traceback instead."""

import os
import subprocess
import sys

import pytest


def _launch(tmp_path, *args, env=None):
    """`python -m bat_jax.launch` from an empty directory; (exit code, stderr lines that are not blank)."""
    cmd = [sys.executable, "-m", "bat_jax.launch", f"--run_dir={tmp_path / 'run'}", *args]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})})
    return proc.returncode, [line for line in proc.stderr.splitlines() if line.strip()]


@pytest.mark.parametrize("args, env, message", [
    (["--gin_file=bicurl_9b.gin"], None,
     "policy.PolicyConfig.checkpoint_dir = '/models/Qwen3.5-9B-Instruct': no such directory"),
    (["--gin_file=bicurl_tiny.gin", "--gin_bindings=evaluation.EvalConfig.tracks = ('nope',)"], None,
     "evaluation.EvalConfig.tracks: ['nope'] are not tracks of benchmark 'imaging'"),
    (["--gin_file=bicurl_tiny.gin", "--gin_bindings=factory.FactoryConfig.foci = ('E2E', 'S9')"], None,
     "factory.FactoryConfig.foci must be distinct values of benchmark 'imaging'"),
    (["--gin_file=bicurl_tiny.gin"], {"DOCKER_HOST": "unix:///nonexistent/docker.sock"},
     "docker backend unavailable"),
    (["--gin_file=no_such_file.gin"], None, "gin file 'no_such_file.gin' not found on the search path"),
    (["--gin_file=bicurl_paper_base.gin", "--gin_bindings=launch.run.job = @launch.show_config"], None,
     "bind no launch.run.run_name: bicurl_paper_base.gin is a base file that run files include; run one of them "
     "(bicurl_4b.gin, bicurl_9b.gin)"),
])
def test_a_configuration_error_is_one_line(tmp_path, args, env, message):
    code, lines = _launch(tmp_path, *args, env=env)
    errors = [line for line in lines if line.startswith("[bat_jax] error:")]
    assert code == 2 and len(errors) == 1 and message in errors[0], lines[-5:]
    assert not any("Traceback" in line for line in lines)


def test_an_incomplete_checkpoint_names_what_is_missing_and_debug_shows_the_traceback(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    binding = f"--gin_bindings=policy.PolicyConfig.checkpoint_dir = '{ckpt}'"
    code, lines = _launch(tmp_path, "--gin_file=bicurl_tiny.gin", binding)
    assert code == 2 and lines[-1] == (f"[bat_jax] error: policy.PolicyConfig.checkpoint_dir = '{ckpt}': incomplete "
                                       "checkpoint, missing ['*.safetensors', 'tokenizer.json']; put a local copy of "
                                       "the Hugging Face checkpoint there or bind the binding to one")
    code, lines = _launch(tmp_path, "--gin_file=bicurl_tiny.gin", binding, "--debug")
    assert code != 0 and any("Traceback" in line for line in lines) and any("ConfigPathError" in line for line in lines)


def test_a_late_stage_the_benchmark_lacks_is_a_configuration_error():
    from bat_jax.bicurl.experiment import _with_late_stages
    from bat_jax.curriculum.controller import ControllerConfig, NonInferiorityMargins
    from bat_jax.errors import ConfigError
    from bat_jax.benchmarks.imaging.benchmark import ImagingBenchmark

    bad = ControllerConfig(margins=NonInferiorityMargins(late_stages=("S9",)))
    with pytest.raises(ConfigError, match=r"controller.NonInferiorityMargins.late_stages \['S9'\] are not stages of "
                                          r"benchmark 'imaging'"):
        _with_late_stages(bad, ImagingBenchmark())
    filled = _with_late_stages(ControllerConfig(), ImagingBenchmark())
    assert filled.margins.late_stages == ("S3", "S4", "S5")
