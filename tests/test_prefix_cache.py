"""Prefix reuse in the JAX sampler (bat_jax/rollout/prefix_cache.py): a second turn that continues a row's
stored decode state samples what a full prefill of the whole conversation samples, on tiny Qwen3 (KV cache only)
and Qwen3.5 (Gated DeltaNet state + conv history + attention) models; the store's own rules."""

import jax.numpy as jnp
import numpy as np
import pytest

from bat_jax.models.gated_deltanet import causal_conv
from bat_jax.rollout.engine import SamplingParams
from bat_jax.rollout.jax_sampler import JaxSampler
from bat_jax.rollout.prefix_cache import PrefixCache, RowState

from doubles import SAMPLER_KW, tiny_model


def _row(tokens):
    return RowState(tokens=np.asarray(tokens, np.int32), layers=(), next_position=len(tokens))


def test_pop_longest_takes_the_longest_strict_prefix_and_removes_it():
    store = PrefixCache(max_rows=8)
    for tokens in ([1, 2], [1, 2, 3], [1, 2, 3, 4, 5], [9, 2, 3]):
        store.put(_row(tokens))
    assert store.pop_longest([1, 2, 3, 4, 5]) .tokens.tolist() == [1, 2, 3]  # equal length is not a strict prefix
    assert store.pop_longest([1, 2, 3, 4, 5]).tokens.tolist() == [1, 2]  # [1, 2, 3] was taken
    assert store.pop_longest([1, 2, 3, 4, 5]) is None
    assert (store.hits, store.reused_tokens, len(store)) == (2, 5, 2)


def test_oldest_rows_leave_first_and_clear_empties():
    store = PrefixCache(max_rows=2)
    for tokens in ([1], [2], [3]):
        store.put(_row(tokens))
    assert store.pop_longest([1, 0]) is None and store.pop_longest([3, 0]).tokens.tolist() == [3]
    store.clear()
    assert len(store) == 0
    with pytest.raises(ValueError, match="max_rows"):
        PrefixCache(0)


def test_conv_skips_the_leading_padding_of_a_cached_segment():
    """History h, then a segment [pad, pad, x1, x2]: the same outputs at x1, x2 and the same new history as the
    unpadded segment [x1, x2]; a fully padded segment keeps the history."""
    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.normal(size=(3, 1, 4)), jnp.float32)
    hist = jnp.asarray(rng.normal(size=(1, 3, 3)), jnp.float32)
    x = jnp.asarray(rng.normal(size=(1, 2, 3)), jnp.float32)
    y_ref, h_ref = causal_conv(x, hist, w)
    padded = jnp.concatenate([jnp.zeros((1, 2, 3)), x], axis=1)
    y, h = causal_conv(padded, hist, w, lead=jnp.array([2]))
    np.testing.assert_allclose(y[:, 2:], y_ref, rtol=1e-6)
    np.testing.assert_allclose(h, h_ref, rtol=1e-6)
    _, kept = causal_conv(jnp.zeros((1, 1, 3)), hist, w, lead=jnp.array([1]))
    np.testing.assert_allclose(kept, hist)


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
def test_second_turn_from_the_stored_state_matches_a_full_prefill(family):
    """Three rows: turn 1 with different prompt lengths and budgets (row 0 stops 10 tokens before the others, so
    its state must not absorb the batch's later decode steps); turn 2 appends an observation to rows 0 and 1
    (they continue their stored states) and sends a fresh prompt as row 2. Same ids as a sampler without reuse,
    logprobs equal to float round-off."""
    model = tiny_model(family)
    plain = JaxSampler(model, **SAMPLER_KW)
    reuse = JaxSampler(model, **SAMPLER_KW, prefix_cache_rows=8)
    rng = np.random.default_rng(1)
    prompts = [rng.integers(1, 256, size=n).tolist() for n in (5, 11, 7)]
    params = SamplingParams(temperature=0.7, max_new_tokens=16, seed=3)
    first = [plain.generate(prompts, params, max_new_tokens=[6, 16, 16]),
             reuse.generate(prompts, params, max_new_tokens=[6, 16, 16])]
    for a, b in zip(*first):
        np.testing.assert_array_equal(a.token_ids, b.token_ids)
    assert [len(c.token_ids) for c in first[0]] == [6, 16, 16]
    assert len(reuse.prefix_cache) == 3
    second = [prompts[i] + first[0][i].token_ids.tolist() + rng.integers(1, 256, size=4).tolist() for i in (0, 1)]
    second.append(rng.integers(1, 256, size=9).tolist())
    params2 = SamplingParams(temperature=0.7, max_new_tokens=16, seed=11)
    want = plain.generate(second, params2)
    got = reuse.generate(second, params2)
    for a, b in zip(want, got):
        np.testing.assert_array_equal(a.token_ids, b.token_ids)
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)
    held = [len(prompts[i]) + len(first[0][i].token_ids) - 1 for i in (0, 1)]
    assert (reuse.prefix_cache.hits, reuse.prefix_cache.reused_tokens) == (2, sum(held))


def test_new_weights_forget_the_stored_states():
    model = tiny_model("qwen3")
    sampler = JaxSampler(model, **SAMPLER_KW, prefix_cache_rows=4)
    sampler.generate([[1, 2, 3]], SamplingParams(max_new_tokens=4))
    assert len(sampler.prefix_cache) == 1
    sampler.update_weights(model)
    assert len(sampler.prefix_cache) == 0


def test_a_failed_call_gives_the_stored_prefixes_back(monkeypatch):
    """A second turn whose sampling call raises (here: the compiled program) leaves the stored state in the store:
    the retried turn continues it (the first turn's tokens reused) and samples what it would have."""
    from bat_jax.rollout import jax_sampler

    model = tiny_model("qwen3")
    sampler = JaxSampler(model, **SAMPLER_KW, prefix_cache_rows=4)
    params = SamplingParams(temperature=0.7, max_new_tokens=4, seed=3)
    first = sampler.generate([[1, 2, 3]], params)[0]
    second = [[1, 2, 3] + first.token_ids.tolist() + [7, 8]]
    want = JaxSampler(model, **SAMPLER_KW).generate(second, params)[0]
    real = jax_sampler._generate

    def broken(*args, **kwargs):
        raise RuntimeError("device lost")

    monkeypatch.setattr(jax_sampler, "_generate", broken)
    with pytest.raises(RuntimeError, match="device lost"):
        sampler.generate(second, params)
    assert len(sampler.prefix_cache) == 1
    monkeypatch.setattr(jax_sampler, "_generate", real)
    got = sampler.generate(second, params)[0]
    np.testing.assert_array_equal(got.token_ids, want.token_ids)
    held = 3 + len(first.token_ids) - 1  # the first turn's tokens whose state is stored
    assert (sampler.prefix_cache.hits, sampler.prefix_cache.reused_tokens) == (2, 2 * held)  # failed call + retry
