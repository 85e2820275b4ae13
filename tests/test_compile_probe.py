"""CI guard on the memory of the run's jitted steps: `launch/bench/compile_probe.py` at reduced size
(tiny Qwen3.5, 256 tokens, the bicurl_9b.gin batch shapes and micro-batches) on 8 fake CPU devices. A step whose
per-device temp grows past its recorded bound fails; the unchunked configuration shows the guard bites.

The CPU backend's figures do not show remat, and they move with the jax version: the bounds are for jax 0.10.2
(pyproject's pin). Re-record them (print `temp` from `probe`) when the pin moves or a step is meant to grow.
"""

import jax
import pytest

from launch.bench import compile_probe as cp

SEQ = 256
SMALL = ("learner.MemoryConfig.logit_chunk = 64", "learner.MemoryConfig.attention_block = 64")
# per-device temp bytes measured with SMALL (jax 0.10.2, 8 CPU devices) + 10 %
RECORDED_TEMP = {"sft_step": 17_662_280, "ref_logprobs": 2_045_512, "grpo_step": 17_657_320,
                 "policy_shift_kl": 6_014_664, "weight_sync_bucket": 1_120_544, "sampler_prefill": 8_811_416,
                 "sampler_decode": 1_560_176}
BOUND = {k: int(v * 1.10) for k, v in RECORDED_TEMP.items()}


@pytest.mark.slow
def test_every_step_stays_under_its_recorded_temp_bound():
    assert jax.device_count() == 8
    run = cp.shapes_from_gin("bicurl_9b.gin", SMALL)
    assert (run.sft.global_batch_size, run.sft.num_micro_batches, run.grpo_rows, run.grpo_micro_batches) == (64, 8, 32, 4)
    assert run.memory.remat == "full" and run.mesh.fsdp == 8
    results = cp.probe(cp.MODELS["tiny"], run, jax.devices(), scale_seq=SEQ, log=lambda *_: None)
    assert set(results) == set(cp.STEPS)
    over = {k: (int(r["temp"]), BOUND[k]) for k, r in results.items() if r["temp"] > BOUND[k]}
    assert not over, f"per-device temp past its bound (bytes, bound): {over}"
    for r in results.values():
        assert r["temp"] > 0 and r["peak"] >= r["temp"] and r["compile_s"] > 0


@pytest.mark.slow
def test_the_guard_catches_full_logits_and_dense_attention():
    run = cp.shapes_from_gin("bicurl_9b.gin", ("learner.MemoryConfig.logit_chunk = 0",
                                               "learner.MemoryConfig.attention_block = 0"))
    results = cp.probe(cp.MODELS["tiny"], run, jax.devices(), steps=("grpo_step", "policy_shift_kl"), scale_seq=SEQ,
                       log=lambda *_: None)
    for step in ("grpo_step", "policy_shift_kl"):
        assert results[step]["temp"] > BOUND[step], (step, results[step]["temp"], BOUND[step])
