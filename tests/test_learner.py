"""The Learner: chunked logprobs equal one call; parameters flow back into the model for weight sync."""

import jax
import numpy as np
from flax import nnx

import pytest

from bat_jax.learn import grpo, sft, train_state
from bat_jax.learn.batching import pad_batch
from bat_jax.learn.learner import Learner, MemoryConfig
from bat_jax.models.mesh import MeshConfig
from bat_jax.learn.optim import OptimizerConfig
from bat_jax.models.configs import Qwen3Config
from bat_jax.models.qwen3 import Qwen3ForCausalLM


def _learner():
    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=16)
    return Learner(Qwen3ForCausalLM(cfg, rngs=nnx.Rngs(0)), MeshConfig(data=1, fsdp=1, tensor=1))


def test_chunked_logprobs_equal_one_call_and_use_the_rollout_transform():
    learner = _learner()
    rng = np.random.default_rng(0)
    batch = {"input_ids": rng.integers(0, 64, (6, 16)).astype(np.int32), "attention_mask": np.ones((6, 16), np.int32)}
    cfg = grpo.GRPOConfig()
    chunked = learner.logprobs(learner.params, batch, cfg, rows_per_call=4)
    whole = learner.logprobs(learner.params, batch, cfg, rows_per_call=6)
    np.testing.assert_allclose(chunked, whole, atol=1e-5)
    logits = learner.apply_fn(learner.params, batch["input_ids"], batch["attention_mask"])
    np.testing.assert_allclose(whole, grpo.shifted_token_logprobs(logits, batch["input_ids"], 0.7), atol=1e-5)


def test_sft_block_trains_and_sync_model_hands_the_parameters_to_the_model():
    learner = _learner()
    before = jax.tree.map(np.asarray, learner.params)
    example = sft.build_sft_example([1, 2, 3], [4, 5], end_of_turn_id=6, max_seq_len=8)
    step_fn, state = learner.sft_block(sft.SFTConfig(optimizer=OptimizerConfig(learning_rate=1e-2),
                                                     global_batch_size=2, total_steps=2), total_steps=2)
    for _ in range(2):
        state, metrics = step_fn(state, pad_batch([example, example], multiple=1, pad_to=8))
    learner.adopt(state)
    after = jax.tree.map(np.asarray, learner.params)
    changed = jax.tree.leaves(jax.tree.map(lambda a, b: bool(np.any(a != b)), before, after))
    assert any(changed)
    model = learner.sync_model()
    model_params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), b), model_params, after)


def test_host_copy_needs_no_device_and_comes_back_sharded():
    from bat_jax.models import mesh as mesh_lib
    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=16)
    learner = Learner(Qwen3ForCausalLM(cfg, rngs=nnx.Rngs(0)), MeshConfig(fsdp=8))
    host = learner.host_copy(learner.params)
    assert all(isinstance(x, np.ndarray) for x in jax.tree.leaves(host))
    back = learner.on_mesh(host)
    emb = back["model"]["embed_tokens"]["weight"]
    assert emb.sharding == learner.param_shardings["model"]["embed_tokens"]["weight"]
    assert emb.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp") and len(emb.sharding.device_set) == 8
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), b), back, host)
    model = learner.sync_model(host)  # a host tree goes onto the mesh, not onto one device
    w = model.model.embed_tokens.weight.get_value()
    assert len(w.sharding.device_set) == 8
    assert mesh_lib.BATCH_AXES == ("data", "fsdp")


def test_grpo_blocks_share_one_jitted_step_and_start_from_a_fresh_optimizer_state():
    learner = _learner()
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 64, (4, 12)).astype(np.int32)
    batch = {"input_ids": ids, "attention_mask": np.ones_like(ids), "loss_mask": np.tile((np.arange(12) >= 6), (4, 1)),
             "old_logprobs": np.full((4, 12), -4.0, np.float32), "ref_logprobs": np.full((4, 12), -4.0, np.float32),
             "advantages": np.array([1.0, -1.0, 0.5, -0.5], np.float32)}
    cfg, opt = grpo.GRPOConfig(kl_coef=0.01), OptimizerConfig(learning_rate=1e-2)
    step1, state = learner.grpo_block(cfg, opt, total_steps=2)
    state, _ = step1(state, batch)
    learner.adopt(state)
    step2, state2 = learner.grpo_block(cfg, opt, total_steps=2)
    assert step2 is step1  # the second round's block compiles nothing new
    assert int(state2.step) == 0
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), state2.params, learner.params)
    assert all(float(np.abs(np.asarray(x)).max()) == 0.0  # Adam moments start at zero again
               for x in jax.tree.leaves(state2.opt_state) if np.asarray(x).ndim > 0)
    assert learner.grpo_block(cfg, OptimizerConfig(learning_rate=1e-3), total_steps=2)[0] is not step1


# every aggregation is checked on full logits in test_objective.py / test_grpo.py; here the default and Dr.GRPO's
@pytest.mark.parametrize("mode", ["seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_chunked_head_entropy_and_micro_batched_gradients_are_exact(mode):
    """The learner's output head in chunks of 4 positions gives the full-logits logprobs and entropy, and the GRPO
    gradient (entropy bonus, clip-higher, dual clip, KL) summed over 4 micro-batches equals the whole batch's."""
    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=16)
    learner = Learner(Qwen3ForCausalLM(cfg, rngs=nnx.Rngs(0)), MeshConfig(data=1, fsdp=1, tensor=1),
                      MemoryConfig(logit_chunk=4))
    assert learner.apply_fn.logit_chunk == 4
    rng = np.random.default_rng(2)
    ids = rng.integers(0, 64, (4, 10)).astype(np.int32)
    loss_mask = np.zeros((4, 10), np.int32)
    loss_mask[0, 3:6], loss_mask[1, 1:10], loss_mask[2, 5:7], loss_mask[3, 8:10] = 1, 1, 1, 1
    batch = {"input_ids": ids, "attention_mask": np.ones_like(ids), "loss_mask": loss_mask,
             "old_logprobs": rng.normal(-4.2, 0.3, (4, 10)).astype(np.float32),
             "ref_logprobs": rng.normal(-4.2, 0.3, (4, 10)).astype(np.float32),
             "advantages": np.array([1.0, -1.0, 0.5, -0.5], np.float32)}
    batch = jax.tree.map(jax.numpy.asarray, batch)
    gcfg = grpo.GRPOConfig(kl_coef=0.05, entropy_coef=0.01, clip_eps_high=0.28, dual_clip=3.0, loss_agg=mode,
                           loss_scale_factor=8.0)
    lp, ent = grpo.sequence_logprobs(learner.apply_fn, learner.params, batch["input_ids"], batch["attention_mask"],
                                     *gcfg.sampling.transform, with_entropy=True)
    logits = learner.apply_fn(learner.params, batch["input_ids"], batch["attention_mask"])
    lp_full, ent_full = grpo.shifted_token_logprobs_and_entropy(logits, batch["input_ids"], *gcfg.sampling.transform)
    np.testing.assert_allclose(lp, lp_full, atol=1e-5)
    np.testing.assert_allclose(ent, ent_full, atol=1e-5)
    assert float(ent[:, 1:].min()) > 3.0  # near-uniform over 64 tokens at init: ln 64 = 4.16
    loss_fn = grpo.make_grpo_loss(learner.apply_fn, gcfg)
    norms = grpo.grpo_normalizers(batch)
    acc = jax.jit(train_state.accumulate_gradients, static_argnums=(0, 4))
    l1, m1, g1 = acc(loss_fn, learner.params, batch, norms, 1)
    lm, mm, gm = acc(loss_fn, learner.params, batch, norms, 4)  # one row per micro-batch
    np.testing.assert_allclose(lm, l1, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(mm["entropy"], m1["entropy"], rtol=1e-5)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(gm)):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-7)
