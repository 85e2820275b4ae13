"""SFT cold start: response-only loss mask, hand-computed loss, schedule, accumulation, checkpoint cadence."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from bat_jax.checkpoint import CheckpointConfig, Checkpointer
from bat_jax.learn import optim, sft, train_state
from bat_jax.models import mesh as mesh_lib
from bat_jax.models.mesh import MeshConfig

EOT = 9


def test_loss_mask_covers_response_and_end_of_turn_only():
    ex = sft.build_sft_example([1, 2, 3], [4, 5], end_of_turn_id=EOT, max_seq_len=8)
    assert ex["input_ids"].tolist() == [1, 2, 3, 4, 5, EOT, 0, 0]
    assert ex["attention_mask"].tolist() == [1, 1, 1, 1, 1, 1, 0, 0]
    assert ex["loss_mask"].tolist() == [0, 0, 0, 1, 1, 1, 0, 0]
    assert ex["input_ids"].dtype == np.int32
    # an end-of-turn already present is not doubled
    ex2 = sft.build_sft_example([1], [4, EOT], end_of_turn_id=EOT, max_seq_len=4)
    assert ex2["input_ids"].tolist() == [1, 4, EOT, 0] and ex2["loss_mask"].tolist() == [0, 1, 1, 0]


def test_too_long_or_empty_is_an_error():
    with pytest.raises(ValueError, match="= 6 > max_seq_len 5"):
        sft.build_sft_example([1, 2, 3], [4, 5], end_of_turn_id=EOT, max_seq_len=5)
    with pytest.raises(ValueError, match="empty response"):
        sft.build_sft_example([1], [], end_of_turn_id=EOT, max_seq_len=5)


def bigram_lm(params, input_ids, attention_mask):
    del attention_mask
    return jnp.take(params["table"], input_ids, axis=0)


def test_sft_loss_is_mean_nll_of_response_tokens():
    rng = np.random.default_rng(0)
    table = rng.normal(size=(10, 10)).astype(np.float32)
    batch = sft.stack_examples(
        [
            sft.build_sft_example([1, 2, 3], [4, 5], EOT, 8),
            sft.build_sft_example([7], [6, 6, 2, 8], EOT, 8),
        ]
    )
    logp = table - np.log(np.exp(table).sum(-1, keepdims=True))
    nll = []
    for ids, lm in zip(batch["input_ids"], batch["loss_mask"]):
        nll += [-logp[ids[t - 1], ids[t]] for t in range(1, 8) if lm[t]]
    assert len(nll) == 3 + 5  # 2 + EOT, 4 + EOT
    loss_fn = sft.make_sft_loss(bigram_lm)
    b = {k: jnp.asarray(v) for k, v in batch.items()}
    loss, metrics = loss_fn({"table": jnp.asarray(table)}, b, sft.sft_normalizers(b))
    assert float(loss) == pytest.approx(np.mean(nll), rel=1e-5)
    assert float(metrics["num_tokens"]) == 8
    # no prompt token carries loss: the gradient reaches only table rows that predict response tokens
    g = jax.jit(jax.grad(lambda p: loss_fn(p, b, sft.sft_normalizers(b))[0]))({"table": jnp.asarray(table)})["table"]
    predictors = {3, 4, 5, 7, 6, 2, 8}  # ids at positions t-1 of loss tokens
    for row in range(10):
        assert (np.abs(np.asarray(g[row])).sum() > 0) == (row in predictors)


def test_cosine_schedule_with_3_percent_warmup():
    cfg = optim.OptimizerConfig()  # paper SFT defaults
    assert (cfg.learning_rate, cfg.weight_decay, cfg.grad_clip_norm, cfg.warmup_ratio) == (2e-5, 0.0, 1.0, 0.03)
    lr = optim.learning_rate_schedule(cfg, total_steps=200)  # warmup = 6 steps
    assert float(lr(0)) == 0.0
    assert float(lr(3)) == pytest.approx(1e-5, rel=1e-5)
    assert float(lr(6)) == pytest.approx(2e-5, rel=1e-5)
    assert float(lr(6 + 97)) == pytest.approx(1e-5, rel=1e-4)  # cosine half-way over the 194 decay steps
    assert float(lr(200)) == pytest.approx(0.0, abs=1e-12)
    const = optim.learning_rate_schedule(optim.GRPO_OPTIMIZER, total_steps=50)
    assert float(const(0)) == float(const(49)) == pytest.approx(1e-6)


def _setup(num_micro_batches, rng_seed=0):
    mesh = mesh_lib.build_mesh(MeshConfig(fsdp=1), jax.devices()[:1])
    rng = np.random.default_rng(rng_seed)
    params = {"table": rng.normal(size=(10, 10)).astype(np.float32)}
    shardings = {"table": NamedSharding(mesh, P())}
    tx = optim.make_optimizer(optim.OptimizerConfig(learning_rate=1e-2, warmup_ratio=0.0), total_steps=20)
    sh = train_state.train_state_shardings(params, shardings, tx, mesh)
    state = train_state.create_train_state(params, tx, sh)
    batch_sh = {k: mesh_lib.batch_sharding(mesh) for k in ("input_ids", "attention_mask", "loss_mask")}
    step = train_state.make_train_step(sft.make_sft_loss(bigram_lm), sft.sft_normalizers, tx, sh, batch_sh, num_micro_batches)
    return state, step, sh


def _batches(n, seed=1):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        exs = [
            sft.build_sft_example(rng.integers(0, 9, size=rng.integers(1, 4)), rng.integers(0, 9, size=rng.integers(1, 5)), EOT, 8)
            for _ in range(4)
        ]
        out.append(sft.stack_examples(exs))
    return out


def test_gradient_accumulation_equals_full_batch():
    s1, step1, _ = _setup(1)
    s4, step4, _ = _setup(4)
    for b in _batches(2):
        s1, m1 = step1(s1, b)
        s4, m4 = step4(s4, b)
        assert float(m4["loss"]) == pytest.approx(float(m1["loss"]), rel=1e-5)
    np.testing.assert_allclose(s4.params["table"], s1.params["table"], atol=1e-6)


def test_checkpoint_every_n_steps_and_resume(tmp_path):
    state, step, sh = _setup(2)
    batches = _batches(6)
    ckpt = Checkpointer(CheckpointConfig(directory=str(tmp_path / "sft"), keep_latest=5))
    seen = []
    state, cursor = train_state.run_steps(
        step, state, batches, num_steps=5, checkpointer=ckpt, checkpoint_every=2, on_metrics=lambda s, m: seen.append(s)
    )
    assert seen == [1, 2, 3, 4, 5] and cursor == 5
    assert ckpt.all_steps() == [2, 4]
    final = jax.device_get(state.params)
    # resume from step 4: restores params + optimizer + cursor, then step 5 reproduces the uninterrupted run
    like, _, _ = _setup(2, rng_seed=7)
    r = ckpt.restore(train_state.abstract_train_state(like, sh))
    assert r.step == 4 and r.extra == {"data_cursor": 4}
    resumed, cursor2 = train_state.run_steps(step, r.state, batches[r.extra["data_cursor"] :], num_steps=1, data_cursor=4)
    assert cursor2 == 5 and int(resumed.step) == 5
    np.testing.assert_allclose(resumed.params["table"], final["table"], atol=1e-7)
    with pytest.raises(ValueError, match="ran out after 1 of 2"):
        train_state.run_steps(step, resumed, batches[5:], num_steps=2)
    ckpt.close()
