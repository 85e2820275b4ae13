"""Policy-shift KL(candidate ‖ best) for the fallback rule (hand-computed values)."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from bat_jax.learn import kl
from bat_jax.learn.kl import PolicyShiftConfig


def table_lm(params, input_ids, attention_mask):
    """Bigram model: logits[b, t] = params[input_ids[b, t]] (a [V, V] table)."""
    del attention_mask
    return jnp.take(params, input_ids, axis=0)


def test_token_kl_hand_value():
    p = np.array([0.5, 0.5])
    q = np.array([0.9, 0.1])
    got = kl.token_kl(jnp.log(jnp.asarray(p))[None, None], jnp.log(jnp.asarray(q))[None, None])
    expected = 0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)
    assert float(got[0, 0]) == pytest.approx(expected, rel=1e-6)


def test_policy_shift_mean_per_token_over_prompts():
    best = jnp.log(jnp.array([[0.5, 0.5], [0.5, 0.5]]))
    cand = jnp.log(jnp.array([[0.9, 0.1], [0.5, 0.5]]))  # differs only after token 0
    k0 = 0.9 * math.log(0.9 / 0.5) + 0.1 * math.log(0.1 / 0.5)
    ids = np.array([[0, 0, 1], [1, 1, 0], [0, 1, 1]], np.int32)
    mask = np.array([[1, 1, 1], [1, 1, 0], [1, 0, 0]], np.int32)
    # valid positions: prompt 0 → tokens 0,0,1 ; prompt 1 → 1,1 ; prompt 2 → 0  (6 tokens, 3 are token 0)
    got = kl.policy_shift_kl(table_lm, cand, best, ids, mask, PolicyShiftConfig(num_prompts=3, batch_size=2))
    assert got == pytest.approx(3 * k0 / 6, rel=1e-5)
    # only the first num_prompts prompts count
    got2 = kl.policy_shift_kl(table_lm, cand, best, ids, mask, PolicyShiftConfig(num_prompts=2, batch_size=2))
    assert got2 == pytest.approx(2 * k0 / 5, rel=1e-5)
    assert kl.policy_shift_kl(table_lm, best, best, ids, mask, PolicyShiftConfig(num_prompts=3)) == pytest.approx(0.0, abs=1e-7)


def test_too_few_prompts_is_an_error():
    ids = np.zeros((3, 4), np.int32)
    with pytest.raises(ValueError, match="3 probe prompts given, num_prompts=256"):
        kl.policy_shift_kl(table_lm, jnp.zeros((2, 2)), jnp.zeros((2, 2)), ids, np.ones_like(ids))


def test_default_is_256_prompts():
    assert PolicyShiftConfig().num_prompts == 256
