"""The decoder-only causal LM (bat_jax/models/causal_lm.py): left padding, cached prefill + decode and the
hidden-states / head split give the full forward's logits; ForwardOptions' refusals; ordered per-layer remat."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bat_jax.models.causal_lm import REMAT_POLICIES, ForwardOptions, ordered_remat

from doubles import tiny_model

IDS = np.array([[5, 17, 3, 99, 42, 7]], np.int32)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
def test_a_left_padded_row_gets_the_unpadded_rows_logits(family):
    model = tiny_model(family)
    plain = np.asarray(model(IDS))
    padded = np.concatenate([np.zeros((1, 3), np.int32), IDS], axis=1)
    mask = np.array([[0, 0, 0, 1, 1, 1, 1, 1, 1]], np.int32)
    got = np.asarray(model(padded, mask))
    assert got.shape == (1, 9, 256) and got.dtype == np.float32
    np.testing.assert_allclose(got[:, 3:], plain, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
def test_prefill_then_decode_steps_give_the_full_forwards_logits(family):
    model = tiny_model(family)
    full = np.asarray(model(IDS))
    cache = model.init_cache(1, 8)
    logits, cache = model.prefill(IDS[:, :4], np.ones((1, 4), np.int32), cache)
    np.testing.assert_allclose(np.asarray(logits), full[:, :4], rtol=1e-4, atol=1e-4)
    for t in (4, 5):
        step, cache = model.decode_step(IDS[:, t], cache)
        np.testing.assert_allclose(np.asarray(step), full[:, t], rtol=1e-4, atol=1e-4)
    last, _ = model.prefill(IDS[:, :4], np.ones((1, 4), np.int32), model.init_cache(1, 8), last_only=True)
    assert last.shape == (1, 1, 256)
    np.testing.assert_allclose(np.asarray(last)[:, 0], full[:, 3], rtol=1e-4, atol=1e-4)


def test_hidden_states_and_the_head_give_the_logits():
    model = tiny_model("qwen3_5")
    h = model.hidden_states(IDS, options=ForwardOptions(remat="full", attention_block=2))
    assert h.shape == (1, 6, 64)
    np.testing.assert_allclose(np.asarray(model.logits_from_hidden(h)), np.asarray(model(IDS)), rtol=1e-4,
                               atol=1e-4)


def test_forward_options_name_what_they_refuse():
    with pytest.raises(ValueError, match="ForwardOptions.remat must be one of .*, got 'sometimes'"):
        ForwardOptions(remat="sometimes")
    with pytest.raises(ValueError, match="ForwardOptions.attention_block must be >= 0, got -1"):
        ForwardOptions(attention_block=-1)


def test_ordered_remat_gives_checkpoint_values_and_pins_the_backward_order():
    rng = np.random.default_rng(5)
    w = {"a": jnp.asarray(rng.normal(size=(6, 6)), jnp.float32), "b": jnp.asarray(rng.normal(size=(6,)), jnp.float32)}
    x = jnp.asarray(rng.normal(size=(2, 3, 6)), jnp.float32)
    mask = jnp.asarray([[1, 1, 0], [1, 1, 1]], bool)
    pos = jnp.asarray([[0, 1, 1], [0, 1, 2]], jnp.int32)

    def layer(s, h, m, p):
        return h + jnp.tanh(h @ s["a"] + s["b"]) * m[..., None] * (1.0 + p[..., None])

    def two_layers(run):
        return lambda s, h: jnp.sum(jnp.sin(run(s, run(s, h, mask, pos), mask, pos)))

    plain = jax.value_and_grad(two_layers(layer), argnums=(0, 1))(w, x)
    for name in ("full", "dots"):
        ordered = jax.jit(jax.value_and_grad(two_layers(ordered_remat(layer, REMAT_POLICIES[name])), argnums=(0, 1)))
        value, grads = ordered(w, x)
        np.testing.assert_allclose(float(value), float(plain[0]), rtol=1e-6)
        for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(plain[1])):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        assert float(jnp.abs(grads[1]).sum()) > 1.0
    jaxpr = str(jax.make_jaxpr(jax.grad(two_layers(ordered_remat(layer, REMAT_POLICIES["full"]))))(w, x))
    # backward: per layer one barrier before the recomputation (residuals + dy), one on (d state, d x)
    assert jaxpr.count("optimization_barrier") == 4, jaxpr
