"""Rollout correction (bat_jax/learn/rollout_correction.py and the GRPO loss's ``is_weights``): hand-computed
weights, masks and metrics; the loss term; and a bf16 vLLM engine against the fp32 JAX learner, where the mismatch
is real and the corrected loss equals a hand computation on that batch."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from bat_jax.learn import grpo, objective
from bat_jax.learn.rollout_correction import correct, merge_metrics
from bat_jax.rollout.sampling import SamplingConfig

LEARNER = np.array([[0.0, -1.0, -2.0, -0.5, 0.0], [0.0, -0.3, -0.3, 0.0, 0.0]])
ENGINE = np.array([[0.0, -1.5, -1.9, -0.5, 0.0], [0.0, -0.1, -0.2, 0.0, 0.0]])
MASK = np.array([[0, 1, 1, 1, 0], [0, 1, 1, 0, 0]])


def test_weights_truncation_masking_and_metrics_by_hand():
    w, keep, m = correct(LEARNER, ENGINE, MASK, tis_cap=1.5, seq_ratio_range=(0.9, 1.1))
    # log w on sampled tokens: row 0: 0.5, -0.1, 0.0; row 1: -0.2, -0.1
    want = np.array([[0, min(np.exp(0.5), 1.5), np.exp(-0.1), 1.0, 0], [0, np.exp(-0.2), np.exp(-0.1), 0, 0]])
    np.testing.assert_allclose(w, want, rtol=1e-6)
    # geometric means: row 0 exp(0.4 / 3) = 1.143 (outside [0.9, 1.1]: masked); row 1 exp(-0.15) = 0.861 (masked)
    assert keep.tolist() == [False, False]
    assert m["mismatch_mean_abs"] == pytest.approx((0.5 + 0.1 + 0.0 + 0.2 + 0.1) / 5)
    assert m["mismatch_max_abs"] == pytest.approx(0.5)
    assert m["tis_truncated_frac"] == pytest.approx(1 / 5)  # exp(0.5) = 1.65 > 1.5
    assert (m["seq_masked"], m["rollouts"], m["tokens"]) == (2.0, 2.0, 5.0)
    _, keep, _ = correct(LEARNER, ENGINE, MASK, tis_cap=None, seq_ratio_range=(0.85, 1.2))
    assert keep.tolist() == [True, True]
    w, keep, m = correct(LEARNER, ENGINE, MASK, tis_cap=None, seq_ratio_range=None)
    np.testing.assert_array_equal(w, MASK.astype(np.float32))
    assert keep.all() and m["tis_truncated_frac"] == 0.0
    merged = merge_metrics([m, {**m, "mismatch_mean_abs": 1.0, "mismatch_max_abs": 2.0, "tokens": 15.0}])
    assert merged["mismatch_mean_abs"] == pytest.approx((0.18 * 5 + 1.0 * 15) / 20)
    assert merged["mismatch_max_abs"] == 2.0 and merged["tokens"] == 20.0
    with pytest.raises(ValueError, match="seq_ratio_range"):
        correct(LEARNER, ENGINE, MASK, tis_cap=None, seq_ratio_range=(1.2, 2.0))
    with pytest.raises(ValueError, match="tis_cap"):
        grpo.GRPOConfig(tis_cap=0.0)
    assert grpo.batch_fields(grpo.GRPOConfig(tis_cap=2.0))[-1] == "is_weights"
    assert "is_weights" not in grpo.batch_fields(grpo.GRPOConfig())


def test_is_weights_multiply_the_policy_term_only():
    cfg = grpo.GRPOConfig(tis_cap=2.0, kl_coef=0.1)
    lp = jnp.asarray(LEARNER, jnp.float32)
    batch = {"loss_mask": jnp.asarray(MASK), "old_logprobs": lp, "ref_logprobs": lp - 0.05,
             "advantages": jnp.asarray([1.0, -0.5]), "is_weights": jnp.asarray([[0, 2, 0.5, 1, 0], [0, 1, 1.5, 0, 0]])}
    t = grpo.grpo_token_terms(lp, batch, cfg)
    plain = grpo.grpo_token_terms(lp, batch, dataclasses.replace(cfg, tis_cap=None))
    np.testing.assert_allclose(t["pg"], plain["pg"] * np.asarray(batch["is_weights"]), rtol=1e-6)
    np.testing.assert_allclose(t["kl"], plain["kl"], rtol=1e-6)  # the KL term is not reweighted
    # ratio 1 (logprobs = old): the policy term is -A · w per sampled token
    np.testing.assert_allclose(t["pg"], -np.asarray([[1.0], [-0.5]]) * np.asarray(batch["is_weights"]) * MASK,
                               rtol=1e-6)


@pytest.mark.vllm
@pytest.mark.slow
def test_bf16_engine_against_fp32_learner_mismatch_and_corrected_loss(tmp_path):
    """A bf16 vLLM engine samples from a tiny fp32 Qwen3; the fp32 learner recomputes the behaviour logprobs. The
    mismatch is non-zero, and the learner's corrected GRPO loss on that batch equals the hand computation
    mean_rows( Σ_t −A_b · min(π_learner / π_engine, C) / tokens_b ) over the rollouts kept (ratio 1 at the
    behaviour parameters, so no clip is active)."""
    pytest.importorskip("vllm")
    from flax import nnx

    from bat_jax.learn.batching import pad_batch
    from bat_jax.learn.learner import Learner, MemoryConfig
    from bat_jax.models.mesh import MeshConfig
    from bat_jax.models.configs import Qwen3Config
    from bat_jax.models.qwen3 import Qwen3ForCausalLM
    from bat_jax.rollout.engine import SamplingParams
    from bat_jax.rollout.vllm_engine import VLLMEngine

    cfg_model = Qwen3Config(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                            num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=512,
                            tie_word_embeddings=False)
    model = Qwen3ForCausalLM(cfg_model, rngs=nnx.Rngs(5))
    model.lm_head.weight.set_value(model.lm_head.weight.get_value() * 6.0)  # peaked: a visible bf16 mismatch
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, 512, n).tolist() for n in (6, 9, 12, 7)]
    engine = VLLMEngine.from_model(model, tmp_path / "vllm", dtype="bfloat16", max_model_len=256,
                                   kv_cache_memory_bytes=32 << 20, max_num_seqs=8)
    try:
        comps = engine.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=12, seed=11))
    finally:
        engine.close()
    rows = []
    for p, c in zip(prompts, comps):
        ids = np.asarray(list(p) + c.token_ids.tolist(), np.int32)
        mask = np.r_[np.zeros(len(p)), np.ones(len(c.token_ids))].astype(np.int32)
        rows.append({"input_ids": ids, "attention_mask": np.ones_like(ids), "loss_mask": mask,
                     "old_logprobs": np.r_[np.zeros(len(p)), c.logprobs].astype(np.float32)})
    learner = Learner(model, MeshConfig(data=1, fsdp=1, tensor=1), MemoryConfig(attention_block=0, logit_chunk=0))
    gcfg = grpo.GRPOConfig(sampling=SamplingConfig(temperature=1.0), kl_coef=0.0, tis_cap=1.02,
                           seq_ratio_range=(0.5, 2.0))
    batch = pad_batch(rows, multiple=1)
    engine_lp = batch["old_logprobs"]
    learner_lp = learner.logprobs(learner.params, batch, gcfg)
    w, keep, m = correct(learner_lp, engine_lp, batch["loss_mask"], tis_cap=gcfg.tis_cap,
                         seq_ratio_range=gcfg.seq_ratio_range)
    print(m)
    assert m["mismatch_mean_abs"] > 1e-4 and m["mismatch_max_abs"] > 1e-3 and m["tis_truncated_frac"] > 0
    adv = np.asarray([1.0, -1.0, 0.5, -0.5], np.float32)
    batch.update(old_logprobs=learner_lp, is_weights=w, advantages=adv,
                 loss_mask=batch["loss_mask"] * keep[:, None].astype(batch["loss_mask"].dtype))
    batch["ref_logprobs"] = learner_lp
    loss_fn = grpo.make_grpo_loss(learner.apply_fn, gcfg)
    jbatch = {k: jnp.asarray(batch[k]) for k in grpo.batch_fields(gcfg)}
    loss, _ = loss_fn(learner.params, jbatch, grpo.grpo_normalizers(jbatch))
    mask = batch["loss_mask"].astype(np.float64)
    per_row = (-adv[:, None] * w * mask).sum(1) / np.maximum(mask.sum(1), 1)
    want = per_row[mask.sum(1) > 0].mean()
    assert float(loss) == pytest.approx(want, rel=1e-5, abs=1e-7)
    assert objective.LOSS_AGGREGATIONS[0] == gcfg.loss_agg == "seq-mean-token-mean"
