"""The optimizer (bat_jax/learn/optim.py): learning-rate schedules against hand-computed values, the clip before
AdamW, and the refusals."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from bat_jax.learn.optim import GRPO_OPTIMIZER, OptimizerConfig, learning_rate_schedule, make_optimizer


def test_cosine_warms_up_linearly_then_decays_to_the_end_ratio():
    # 100 steps, 10 % warmup: 0 → 1e-3 over steps 0..10, then 1e-3 · (0.1 + 0.9 · (1 + cos(π (s − 10) / 90)) / 2)
    lr = learning_rate_schedule(OptimizerConfig(learning_rate=1e-3, warmup_ratio=0.1, end_lr_ratio=0.1), 100)
    assert float(lr(0)) == 0.0
    assert float(lr(5)) == pytest.approx(5e-4)
    assert float(lr(10)) == pytest.approx(1e-3)
    assert float(lr(55)) == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5), rel=1e-5)  # halfway: cos(π / 2) = 0
    assert float(lr(100)) == pytest.approx(1e-4)


def test_the_paper_sft_default_warms_up_over_3_percent_of_the_steps():
    lr = learning_rate_schedule(OptimizerConfig(), 200)  # 2e-5 peak, round(0.03 · 200) = 6 warmup steps
    assert float(lr(3)) == pytest.approx(1e-5)
    assert float(lr(6)) == pytest.approx(2e-5)
    assert float(lr(103)) == pytest.approx(2e-5 * (1 + math.cos(math.pi * 97 / 194)) / 2, rel=1e-5)
    assert float(lr(200)) == pytest.approx(0.0, abs=1e-12)


def test_constant_schedules_with_and_without_warmup():
    assert [float(learning_rate_schedule(GRPO_OPTIMIZER, 50)(s)) for s in (0, 49)] == [1e-6, 1e-6]
    lr = learning_rate_schedule(OptimizerConfig(learning_rate=4e-4, schedule="constant", warmup_ratio=0.25), 8)
    assert [float(lr(s)) for s in (0, 1, 2, 5)] == pytest.approx([0.0, 2e-4, 4e-4, 4e-4])


def test_the_gradient_is_clipped_to_the_global_norm_before_adamw():
    # One AdamW step from zero moments moves a parameter by −lr · g / (|g| + eps); with eps = 1 the size of g shows.
    # The clip scales g = (3, 4) (norm 5) to (0.6, 0.8): steps 0.1 · (0.6 / 1.6, 0.8 / 1.8).
    # Unclipped: 0.1 · (3 / 4, 4 / 5).
    def step(clip):
        config = OptimizerConfig(learning_rate=0.1, schedule="constant", warmup_ratio=0.0, grad_clip_norm=clip,
                                 eps=1.0)
        opt = make_optimizer(config, 10)
        params = {"w": jnp.zeros(2)}
        updates, _ = opt.update({"w": jnp.array([3.0, 4.0])}, opt.init(params), params)
        return np.asarray(updates["w"])

    np.testing.assert_allclose(step(1.0), [-0.0375, -0.1 * 0.8 / 1.8], rtol=1e-5)
    np.testing.assert_allclose(step(None), [-0.075, -0.08], rtol=1e-5)
    opt = make_optimizer(OptimizerConfig(), 10)
    params = {"w": jnp.zeros(2)}
    zero, _ = opt.update({"w": jnp.zeros(2)}, opt.init(params), params)
    np.testing.assert_array_equal(np.asarray(zero["w"]), [0.0, 0.0])  # all-zero gradient: all-zero update


def test_bad_schedules_are_refused():
    with pytest.raises(ValueError, match="total_steps must be >= 1"):
        learning_rate_schedule(OptimizerConfig(), 0)
    with pytest.raises(ValueError, match="schedule must be one of"):
        learning_rate_schedule(OptimizerConfig(schedule="linear"), 10)
