"""Memory features change memory, not values: chunked output head (GRPO / SFT / reference logprobs /
policy-shift KL), per-layer remat, blockwise attention, batch-sharded activations; 1 vs 8 fake CPU devices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from bat_jax.learn import grpo, kl, sft
from bat_jax.learn import train_state as ts
from bat_jax.learn.learner import Learner, MemoryConfig
from bat_jax.models.mesh import MeshConfig
from bat_jax.learn.optim import OptimizerConfig
from bat_jax.models.causal_lm import ForwardOptions
from bat_jax.models.configs import Qwen3_5Config, Qwen3Config
from bat_jax.models import layers
from bat_jax.models.layers import attend, attend_causal, causal_valid
from bat_jax.models.qwen3 import Qwen3ForCausalLM
from bat_jax.models.qwen3_5 import Qwen3_5ForCausalLM
from bat_jax.rollout.sampling import SamplingConfig

B, T, V = 8, 22, 96
CFG35 = Qwen3_5Config(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, linear_key_head_dim=8, linear_value_head_dim=8,
                      linear_num_key_heads=2, linear_num_value_heads=4, chunk_size=8, tie_word_embeddings=False)
CFG3 = Qwen3Config(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=8)
GRPO_CFG = grpo.GRPOConfig(kl_coef=0.05, sampling=SamplingConfig(top_p=0.9))


def _model(family="qwen3_5"):
    if family == "qwen3_5":
        return Qwen3_5ForCausalLM(CFG35, rngs=nnx.Rngs(0))
    return Qwen3ForCausalLM(CFG3, rngs=nnx.Rngs(0))


def _batch(seed=0):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(T // 2, T + 1, size=B)
    attn = (np.arange(T)[None] < lengths[:, None]).astype(np.int32)  # right padding
    ids = rng.integers(1, V, size=(B, T)).astype(np.int32) * attn
    loss = attn.copy()
    loss[:, :5] = 0
    return {"input_ids": ids, "attention_mask": attn, "loss_mask": loss,
            "old_logprobs": rng.normal(-3.0, 0.3, (B, T)).astype(np.float32) * attn,
            "ref_logprobs": rng.normal(-3.0, 0.3, (B, T)).astype(np.float32) * attn,
            "advantages": rng.normal(size=B).astype(np.float32)}


def _loss_and_grad(loss_maker, apply_fn, params, batch, normalizer_fn):
    loss_fn = loss_maker(apply_fn)
    norm = normalizer_fn(batch)
    (loss, metrics), grads = jax.jit(jax.value_and_grad(lambda p: loss_fn(p, batch, norm), has_aux=True))(params)
    return float(loss), jax.tree.map(np.asarray, metrics), jax.tree.map(np.asarray, grads)


def _assert_trees_close(a, b, rtol, atol):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(x, y, rtol=rtol, atol=atol)


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3"])
def test_grpo_loss_and_grad_equal_with_chunked_head_remat_and_blockwise_attention(family):
    model = _model(family)
    plain, params, _ = ts.split_model(model)
    full_logits = lambda p, i, m: plain(p, i, m)  # a plain function: the unchunked path (full [B, T, V] logits)
    batch = {k: jnp.asarray(v) for k, v in _batch().items()}
    make = lambda f: grpo.make_grpo_loss(f, GRPO_CFG)  # noqa: E731
    ref_loss, ref_m, ref_g = _loss_and_grad(make, full_logits, params, batch, grpo.grpo_normalizers)
    assert ref_loss != 0.0 and np.isfinite(ref_loss)
    for opts, chunk in [(ForwardOptions(attention_block=0), 8),  # chunked head only (22 = 8 + 8 + 6 padded)
                        (ForwardOptions(attention_block=8), 0),  # blockwise attention only
                        (ForwardOptions(remat="full", attention_block=8), 5),
                        (ForwardOptions(remat="dots", attention_block=0), 22)]:
        apply_fn = ts.ModelApply(*nnx.split(model, nnx.Param, ...)[::2], options=opts, logit_chunk=chunk)
        loss, m, g = _loss_and_grad(make, apply_fn, params, batch, grpo.grpo_normalizers)
        assert abs(loss - ref_loss) <= 1e-6 * max(1.0, abs(ref_loss)), (opts, chunk, loss, ref_loss)
        _assert_trees_close(m, ref_m, 1e-5, 1e-7)
        _assert_trees_close(g, ref_g, 1e-5, 1e-7)


def test_sft_loss_and_reference_logprobs_equal_chunked():
    model = _model()
    plain, params, _ = ts.split_model(model)
    full_logits = lambda p, i, m: plain(p, i, m)  # noqa: E731
    chunked = ts.ModelApply(*nnx.split(model, nnx.Param, ...)[::2], options=ForwardOptions(remat="full",
                                                                                            attention_block=4),
                            logit_chunk=4)
    batch = {k: jnp.asarray(v) for k, v in _batch(1).items() if k in ("input_ids", "attention_mask", "loss_mask")}
    ref = _loss_and_grad(sft.make_sft_loss, full_logits, params, batch, sft.sft_normalizers)
    out = _loss_and_grad(sft.make_sft_loss, chunked, params, batch, sft.sft_normalizers)
    assert abs(out[0] - ref[0]) <= 1e-6 * abs(ref[0]) and ref[0] > 1.0
    _assert_trees_close(out[2], ref[2], 1e-5, 1e-7)
    lp_ref = grpo.make_logprob_fn(full_logits, GRPO_CFG)(params, batch["input_ids"], batch["attention_mask"])
    lp = grpo.make_logprob_fn(chunked, GRPO_CFG)(params, batch["input_ids"], batch["attention_mask"])
    np.testing.assert_allclose(np.asarray(lp), np.asarray(lp_ref), atol=2e-6)
    assert np.all(np.asarray(lp)[:, 0] == 0.0)


def test_policy_shift_kl_equal_chunked():
    model = _model()
    plain, params, _ = ts.split_model(model)
    other = jax.tree.map(lambda x: x + 0.05 * jnp.sin(jnp.arange(x.size, dtype=x.dtype).reshape(x.shape)), params)
    chunked = ts.ModelApply(*nnx.split(model, nnx.Param, ...)[::2], logit_chunk=3)
    b = _batch(2)
    full = kl.make_kl_sum_fn(lambda p, i, m: plain(p, i, m))(params, other, b["input_ids"], b["attention_mask"])
    part = kl.make_kl_sum_fn(chunked)(params, other, b["input_ids"], b["attention_mask"])
    assert float(full[0]) > 1e-3
    np.testing.assert_allclose(float(part[0]), float(full[0]), rtol=1e-5)
    assert float(part[1]) == float(full[1]) == b["attention_mask"].sum()


def test_blockwise_attention_equals_dense_with_padding_and_offset(monkeypatch):
    rng = np.random.default_rng(3)
    q = jnp.asarray(rng.normal(size=(2, 13, 4, 8)), jnp.float32)
    k = jnp.asarray(rng.normal(size=(2, 20, 2, 8)), jnp.float32)
    v = jnp.asarray(rng.normal(size=(2, 20, 2, 8)), jnp.float32)
    key_mask = jnp.asarray(np.arange(20)[None] >= np.array([[0], [3]]))  # row 1 left-padded by 3
    dense = attend(q, k, v, causal_valid(key_mask, 7, 13))
    traced = jax.jit(attend_causal, static_argnums=5)  # a traced q_offset: blocks over every key (lax.map)
    for block in (4, 5, 13):
        for out in (attend_causal(q, k, v, key_mask, 7, block), traced(q, k, v, key_mask, 7, block)):
            np.testing.assert_allclose(np.asarray(out), np.asarray(dense), atol=1e-6)
    # more blocks than layers.MAX_UNROLLED_BLOCKS: longer blocks (13 queries, at most 2 blocks), same values
    monkeypatch.setattr(layers, "MAX_UNROLLED_BLOCKS", 2)
    np.testing.assert_allclose(np.asarray(attend_causal(q, k, v, key_mask, 7, 1)), np.asarray(dense), atol=1e-6)
    g_dense = jax.grad(lambda q, k, v: jnp.sum(jnp.sin(attend(q, k, v, causal_valid(key_mask, 7, 13)))),
                       argnums=(0, 1, 2))(q, k, v)
    for offset_kind in (int, jnp.int32):  # static (keys cut per block) and traced offsets
        g_block = jax.grad(lambda q, k, v: jnp.sum(jnp.sin(attend_causal(q, k, v, key_mask, offset_kind(7), 4))),
                           argnums=(0, 1, 2))(q, k, v)
        for got, want in zip(g_block, g_dense, strict=True):
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)


def test_memory_config_rejects_unknown_remat():
    with pytest.raises(ValueError, match="remat"):
        MemoryConfig(remat="everything")
    with pytest.raises(ValueError, match="remat"):
        ForwardOptions(remat="sometimes")


def _grpo_step_on(devices: int, memory: MemoryConfig, micro: int):
    learner = Learner(_model(), MeshConfig(data=1, fsdp=devices, tensor=1), memory)
    batch = _batch(4)
    ref = learner.logprobs(learner.params, batch, GRPO_CFG)
    # Adam eps 1e-3 keeps the first update a smooth function of the gradient (with eps 1e-8 it is ~sign(g),
    # so a 1e-7 change of a near-zero gradient entry would flip a whole lr-sized update)
    opt = OptimizerConfig(learning_rate=1e-3, schedule="constant", warmup_ratio=0.0, eps=1e-3)
    step, state = learner.grpo_block(GRPO_CFG, opt, total_steps=2, num_micro_batches=micro)
    state, metrics = step(state, batch)
    return ref, {k: float(v) for k, v in metrics.items()}, jax.tree.map(np.asarray, state.params)


def test_grpo_step_one_vs_eight_devices_with_remat_and_sharded_activations():
    assert jax.device_count() == 8
    memory = MemoryConfig(remat="full", attention_block=8, logit_chunk=8)
    ref1, m1, p1 = _grpo_step_on(1, MemoryConfig(remat="none", attention_block=0, logit_chunk=0,
                                                 shard_activations=False), micro=1)
    ref8, m8, p8 = _grpo_step_on(8, memory, micro=2)
    np.testing.assert_allclose(ref8, ref1, atol=1e-5)
    assert m1["loss"] != 0.0
    for key in ("loss", "pg_loss", "kl", "grad_norm"):
        assert abs(m8[key] - m1[key]) <= 1e-5 * max(1.0, abs(m1[key])), (key, m8[key], m1[key])
    _assert_trees_close(p8, p1, 0, 1e-6)
