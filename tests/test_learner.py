"""The Learner: chunked logprobs equal one call; parameters flow back into the model for weight sync."""

import jax
import numpy as np
from flax import nnx

from bat_jax.learn import grpo, sft
from bat_jax.learn.learner import Learner, pad_batch
from bat_jax.learn.mesh import MeshConfig
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
    cfg = grpo.GRPOConfig(temperature=0.7)
    chunked = learner.logprobs(learner.params, batch, cfg, rows_per_call=4)
    whole = learner.logprobs(learner.params, batch, cfg, rows_per_call=6)
    np.testing.assert_allclose(chunked, whole, atol=1e-5)
    logits = learner.apply_fn(learner.params, batch["input_ids"], batch["attention_mask"])
    np.testing.assert_allclose(whole, grpo.token_logprobs(logits, batch["input_ids"], 0.7), atol=1e-5)


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


def test_pad_batch_pads_rows_and_length():
    rows = [{"input_ids": np.array([1, 2, 3], np.int32), "w": np.float32(0.5)},
            {"input_ids": np.array([4], np.int32), "w": np.float32(1.0)}]
    out = pad_batch(rows, multiple=4)
    assert out["input_ids"].shape == (4, 4) and out["w"].tolist() == [0.5, 1.0, 0.0, 0.0]
    assert out["input_ids"][1].tolist() == [4, 0, 0, 0]


def test_host_copy_needs_no_device_and_comes_back_sharded():
    from bat_jax.learn import mesh as mesh_lib
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
