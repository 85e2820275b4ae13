"""Continuous batching (bat_jax/rollout/continuous_batching.py): rows of concurrent calls that join and leave a
running batch between decode chunks sample exactly what `JaxSampler.generate` samples for the same prompts and
seeds, on tiny Qwen3 (KV cache only) and Qwen3.5 (Gated DeltaNet state + attention) models."""

import threading

import numpy as np
import pytest

from bat_jax.rollout.continuous_batching import ContinuousBatchingSampler
from bat_jax.rollout.engine import FINISH_LENGTH, FINISH_STOP, SamplingParams
from bat_jax.rollout.jax_sampler import JaxSampler

from doubles import SAMPLER_KW, tiny_model

_MODELS = {}


def _model(family):
    if family not in _MODELS:
        _MODELS[family] = tiny_model(family)
    return _MODELS[family]


def _concurrently(engine, calls):
    """Runs `engine.generate(*args, **kw)` for every (args, kw) in `calls` in its own thread; results in order."""
    out = [None] * len(calls)
    errors = []

    def run(i, args, kw):
        try:
            out[i] = engine.generate(*args, **kw)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i, a, k)) for i, (a, k) in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    if errors:
        raise errors[0]
    return out


def _assert_same(want, got):
    for i, (a, b) in enumerate(zip(want, got)):
        np.testing.assert_array_equal(a.token_ids, b.token_ids, err_msg=f"row {i}")
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4, err_msg=f"row {i}")
        assert a.finish_reason == b.finish_reason, i


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
def test_rows_joining_a_running_batch_sample_what_generate_samples(family):
    """Seven rows (prompts of 3–13 tokens, budgets 1–20, one stop id that some rows draw early) in three
    concurrent calls through 3 slots and chunks of 4 steps: rows wait in the queue, join mid-flight and leave at
    different steps; every row's ids, logprobs and finish reason equal `generate`'s for the same prompt and seed."""
    model = _model(family)
    plain = JaxSampler(model, **SAMPLER_KW)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, 256, size=n).tolist() for n in (3, 13, 7, 5, 9, 4, 11)]
    budgets = [20, 1, 17, 9, 20, 14, 6]
    seeds = [5, 6, 7, 8, 9, 10, 11]
    free = plain.generate(prompts, SamplingParams(temperature=0.9, max_new_tokens=20), max_new_tokens=budgets,
                          seeds=seeds)
    stop = int(free[0].token_ids[4])  # row 0 stops at its fifth token; others may draw it too
    params = SamplingParams(temperature=0.9, max_new_tokens=20, stop_token_ids=(stop,))
    want = plain.generate(prompts, params, max_new_tokens=budgets, seeds=seeds)
    assert want[0].finish_reason == FINISH_STOP and len(want[0].token_ids) == 5
    assert want[1].finish_reason in (FINISH_LENGTH, FINISH_STOP) and len(want[1].token_ids) == 1
    engine = ContinuousBatchingSampler(JaxSampler(model, **SAMPLER_KW), slots=3, chunk_steps=4, headroom_chunks=1)
    parts = [(0, 3), (3, 5), (5, 7)]
    got = _concurrently(engine, [((prompts[a:b], params), dict(max_new_tokens=budgets[a:b], seeds=seeds[a:b]))
                                 for a, b in parts])
    _assert_same(want, [c for call in got for c in call])
    assert engine.chunks >= 5 and engine.rebuilds >= 3  # the 20-token rows needed several chunks and admissions
    assert all(r is None for r in engine._rows) and not engine._queue


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
def test_next_turn_continues_the_stored_state(family):
    """Turn 2 of two episodes (their turn-1 prompt + completion + 3 new tokens) continues the states the batch
    stored when their rows finished: same ids as a full prefill without a prefix store, 2 store hits."""
    model = _model(family)
    plain = JaxSampler(model, **SAMPLER_KW)
    engine = ContinuousBatchingSampler(JaxSampler(model, **SAMPLER_KW, prefix_cache_rows=8), slots=2, chunk_steps=3)
    rng = np.random.default_rng(2)
    prompts = [rng.integers(1, 256, size=n).tolist() for n in (6, 10)]
    params = SamplingParams(temperature=0.7, max_new_tokens=12)
    first = engine.generate(prompts, params, max_new_tokens=[7, 12], seeds=[1, 2])
    _assert_same(plain.generate(prompts, params, max_new_tokens=[7, 12], seeds=[1, 2]), first)
    second = [p + c.token_ids.tolist() + rng.integers(1, 256, size=3).tolist() for p, c in zip(prompts, first)]
    got = engine.generate(second, params, seeds=[3, 4])
    _assert_same(plain.generate(second, params, seeds=[3, 4]), got)
    assert engine.sampler.prefix_cache.hits == 2


def test_calls_with_other_sampling_parameters_wait_for_the_batch_to_drain():
    """A greedy call and a T = 0.9 call at once: each gets what `generate` gives it alone."""
    model = _model("qwen3")
    plain = JaxSampler(model, **SAMPLER_KW)
    rng = np.random.default_rng(3)
    prompts = [rng.integers(1, 256, size=n).tolist() for n in (4, 8)]
    greedy, hot = SamplingParams(temperature=0.0, max_new_tokens=8), SamplingParams(temperature=0.9, max_new_tokens=8)
    engine = ContinuousBatchingSampler(JaxSampler(model, **SAMPLER_KW), slots=4, chunk_steps=2)
    got = _concurrently(engine, [((prompts, greedy), dict(seeds=[1, 2])), ((prompts, hot), dict(seeds=[1, 2]))])
    _assert_same(plain.generate(prompts, greedy, seeds=[1, 2]), got[0])
    _assert_same(plain.generate(prompts, hot, seeds=[1, 2]), got[1])


def test_bad_requests_and_bounds_raise_clear_errors():
    engine = ContinuousBatchingSampler(JaxSampler(_model("qwen3"), **SAMPLER_KW), slots=2)
    params = SamplingParams(max_new_tokens=4)
    with pytest.raises(ValueError, match="row 1 is empty"):
        engine.generate([[1, 2], []], params)
    with pytest.raises(ValueError, match="budget 9"):
        engine.generate([[1, 2]], params, max_new_tokens=[9])
    assert engine.generate([], params) == []
    with pytest.raises(ValueError, match="slots"):
        ContinuousBatchingSampler(engine.sampler, slots=0)
    assert engine.update_weights(engine.sampler._state) == 1 and engine.weight_version == 1


def test_a_sync_with_rows_in_flight_swaps_between_chunks():
    """After the first decode chunk of a 16-token greedy row, a plain sync is refused (rows in flight) and an
    `in_flight` sync swaps the weights between two chunks: the row finishes, reports the version it was admitted on,
    and (the same weights installed) samples what `generate` samples; the next call reports the new version."""
    from flax import nnx

    model = _model("qwen3")
    engine = ContinuousBatchingSampler(JaxSampler(model, **SAMPLER_KW), slots=2, chunk_steps=2)
    prompts, params = [[5, 6, 7, 8]], SamplingParams(temperature=0.0, max_new_tokens=16)
    want = JaxSampler(model, **SAMPLER_KW).generate(prompts, params, seeds=[1])
    seen, real_step = {}, engine._step

    def step():
        real_step()
        if engine.chunks == 1 and "sync" not in seen:
            seen["in_flight"] = any(r is not None for r in engine._rows)
            with pytest.raises(RuntimeError, match="rows are still being generated"):
                engine.update_weights(nnx.state(model))
            seen["sync"] = threading.Thread(target=lambda: seen.setdefault(
                "version", engine.update_weights(nnx.state(model), in_flight=True)))
            seen["sync"].start()
            assert engine._swap.wait(5)  # the driver stops after this chunk

    engine._step = step
    got = engine.generate(prompts, params, seeds=[1])
    seen["sync"].join(5)
    assert seen["in_flight"] and seen["version"] == 1 and engine.weight_version == 1
    assert got[0].weight_version == 0 and len(got[0].token_ids) == 16 and engine.chunks > 1
    _assert_same(want, got)
    assert engine.generate(prompts, params, seeds=[1])[0].weight_version == 1
