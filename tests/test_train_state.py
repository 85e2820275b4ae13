"""The train state's micro-batching (bat_jax/learn/train_state.py): rows split round-robin into micro-batches, and
gradients accumulated over them equal the full batch's, on hand-computed values."""

import jax.numpy as jnp
import numpy as np
import pytest

from bat_jax.learn.train_state import accumulate_gradients, split_micro_batches


def test_micro_batch_m_holds_rows_m_m_plus_M_and_so_on():
    batch = {"x": jnp.arange(12).reshape(6, 2), "y": jnp.arange(6)}
    micro = split_micro_batches(batch, 3)
    assert micro["y"].tolist() == [[0, 3], [1, 4], [2, 5]]
    assert micro["x"].shape == (3, 2, 2) and micro["x"][1].tolist() == [[2, 3], [8, 9]]
    with pytest.raises(ValueError, match="batch field 'x': 5 rows do not divide into 2 micro-batches"):
        split_micro_batches({"x": jnp.zeros((5, 1))}, 2)


def test_accumulated_gradients_equal_the_full_batch():
    # loss = Σ_rows w · x (a sum over rows, normalised by the whole batch's count as the real losses are):
    # d loss / d w = Σ x / N = (1 + 2 + 3 + 4) / 4 = 2.5, loss = 2 · 2.5 = 5 at w = 2
    def loss_fn(w, batch, norm):
        value = jnp.sum(w * batch["x"]) / norm["n"]
        return value, {"rows": jnp.asarray(batch["x"].shape[0], jnp.float32)}

    batch, norm = {"x": jnp.asarray([1.0, 2.0, 3.0, 4.0])}, {"n": jnp.asarray(4.0)}
    for m in (1, 2, 4):
        loss, metrics, grad = accumulate_gradients(loss_fn, jnp.asarray(2.0), batch, norm, m)
        assert float(loss) == pytest.approx(5.0) and float(grad) == pytest.approx(2.5)
        assert float(metrics["rows"]) == 4.0  # per-micro-batch metrics summed
    np.testing.assert_allclose(float(accumulate_gradients(loss_fn, jnp.asarray(0.0), batch, norm, 2)[2]), 2.5)
