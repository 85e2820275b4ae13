"""LoRA (bat_jax/models/lora.py, the learner's adapter-only training): B = 0 leaves every family's logits exactly as
they were; an SFT or GRPO step moves the adapter only (the base bit-identical) with Adam state for the adapter only;
the loss does not depend on the mesh."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from bat_jax.learn import grpo, sft
from bat_jax.learn.batching import pad_batch
from bat_jax.learn.learner import Learner
from bat_jax.learn.optim import OptimizerConfig
from bat_jax.models import lora
from bat_jax.models.configs import LlamaConfig, Qwen3_5Config, Qwen3Config
from bat_jax.models.llama import LlamaForCausalLM
from bat_jax.models.mesh import MeshConfig
from bat_jax.models.qwen3 import Qwen3ForCausalLM
from bat_jax.models.qwen3_5 import Qwen3_5ForCausalLM
from bat_jax.policy import PolicyConfig, build_policy

DENSE = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1, head_dim=16)
HYBRID = dict(DENSE, linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=1,
              linear_num_value_heads=2, layer_types=("linear_attention", "full_attention"))
BASE = lora.BASE


def _model(family: str, seed: int = 0):
    if family == "qwen3":
        return Qwen3ForCausalLM(Qwen3Config(**DENSE), rngs=nnx.Rngs(seed))
    if family == "qwen3_5":
        return Qwen3_5ForCausalLM(Qwen3_5Config(**HYBRID), rngs=nnx.Rngs(seed))
    return LlamaForCausalLM(LlamaConfig(**DENSE, tie_word_embeddings=False), rngs=nnx.Rngs(seed))


def _ids(rows=3, t=11, seed=0):
    return jnp.asarray(np.random.default_rng(seed).integers(0, 64, (rows, t)), jnp.int32)


def _host(tree):
    return jax.tree.map(np.asarray, nnx.to_pure_dict(tree) if isinstance(tree, nnx.State) else tree)


ATTENTION_MLP = ["mlp.down_proj", "mlp.gate_proj", "mlp.up_proj", "self_attn.k_proj", "self_attn.o_proj",
                 "self_attn.q_proj", "self_attn.v_proj"]
DELTANET_MLP = ["linear_attn.in_proj_qkv", "linear_attn.in_proj_z", "linear_attn.out_proj", "mlp.down_proj",
                "mlp.gate_proj", "mlp.up_proj"]  # sorted


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5", "llama"])
def test_zero_b_gives_exactly_the_base_models_logits(family):
    model = _model(family)
    ids, mask = _ids(), jnp.asarray(np.array([[0] * 3 + [1] * 8, [1] * 11, [0] * 6 + [1] * 5]), jnp.int32)
    before = model(ids, mask)
    paths = lora.add_lora(model, lora.LoRAConfig(rank=4, alpha=8.0))
    layer0 = DELTANET_MLP if family == "qwen3_5" else ATTENTION_MLP
    assert sorted(paths) == [f"model.layers.0.{p}" for p in layer0] + [f"model.layers.1.{p}" for p in ATTENTION_MLP]
    assert lora.adapter_paths(model) == paths and lora.has_lora(model)
    q = model.model.layers[1].self_attn.q_proj
    assert q.lora_a.shape == (4, 32) and q.lora_b.shape == (q.weight.shape[0], 4) and q.lora_scale == 2.0
    assert float(jnp.abs(q.lora_b[...]).max()) == 0.0 and 0 < float(jnp.abs(q.lora_a[...]).max()) <= 32 ** -0.5
    np.testing.assert_array_equal(np.asarray(model(ids, mask)), np.asarray(before))  # exactly, not to a tolerance


def test_a_nonzero_adapter_adds_scale_times_x_a_b():
    """One projection by hand: y = x W^T + (alpha / r) (x A^T) B^T."""
    model = _model("qwen3")
    lora.add_lora(model, lora.LoRAConfig(rank=2, alpha=6.0, target_modules=("layers.0.mlp.up_proj",)))
    up = model.model.layers[0].mlp.up_proj
    rng = np.random.default_rng(1)
    up.lora_b[...] = jnp.asarray(rng.normal(size=(64, 2)), jnp.float32)
    x = rng.normal(size=(5, 32)).astype(np.float32)
    a, b, w = np.asarray(up.lora_a[...]), np.asarray(up.lora_b[...]), np.asarray(up.weight[...])
    np.testing.assert_allclose(np.asarray(up(jnp.asarray(x))), x @ w.T + 3.0 * (x @ a.T) @ b.T, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(lora.merged_weight(up)), w + 3.0 * b @ a, rtol=1e-6, atol=1e-7)


def test_target_rules_are_peft_s_and_bad_configs_are_refused():
    assert lora.is_target("model.layers.0.self_attn.q_proj", ("q_proj",))
    assert not lora.is_target("model.layers.0.self_attn.q_proj", ("proj",))  # a name, not a substring
    assert lora.is_target("model.layers.3.mlp.up_proj", r".*layers\.3\..*")
    assert not lora.is_target("model.layers.13.mlp.up_proj", r"layers\.3\..*")  # fullmatch
    for bad, match in [(dict(rank=0), "rank"), (dict(alpha=0.0), "alpha"), (dict(dropout=0.05), "dropout"),
                       (dict(target_modules=()), "target_modules")]:
        with pytest.raises(ValueError, match=match):
            lora.LoRAConfig(**bad)
    with pytest.raises(ValueError, match="match no projection"):
        lora.add_lora(_model("qwen3"), lora.LoRAConfig(target_modules=("lm_head_x",)))
    model = _model("qwen3")
    lora.add_lora(model, lora.LoRAConfig())
    with pytest.raises(ValueError, match="already carries"):
        lora.add_lora(model, lora.LoRAConfig())


def test_the_policy_binds_lora_in_one_place():
    micro = {k: v for k, v in HYBRID.items() if k not in ("vocab_size", "layer_types")}
    plain = build_policy(PolicyConfig(tiny=micro))
    adapted = build_policy(PolicyConfig(tiny=micro, lora=lora.LoRAConfig(rank=4)))
    assert not lora.has_lora(plain.model) and len(lora.adapter_paths(adapted.model)) == 12  # 2 DeltaNet layers
    jax.tree.map(np.testing.assert_array_equal, _host(nnx.state(plain.model, nnx.Param)),
                 _host(nnx.state(adapted.model, BASE)))


def _lora_learner(mesh=MeshConfig(data=1, fsdp=1, tensor=1), family="qwen3_5"):
    model = _model(family)
    lora.add_lora(model, lora.LoRAConfig(rank=4, alpha=8.0))
    return Learner(model, mesh)


def _sft_batch():
    examples = [sft.build_sft_example([1, 2, 3], [4, 5, 7], end_of_turn_id=6, max_seq_len=12),
                sft.build_sft_example([9, 8], [10, 11, 12, 13], end_of_turn_id=6, max_seq_len=12),
                sft.build_sft_example([20, 21, 22, 23, 24], [30, 31], end_of_turn_id=6, max_seq_len=12),
                sft.build_sft_example([40], [41, 42, 43, 44, 45, 46, 47], end_of_turn_id=6, max_seq_len=12)]
    return pad_batch(examples, multiple=1, pad_to=12)


def _grpo_batch():
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 64, (4, 12)).astype(np.int32)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "loss_mask": np.tile(np.arange(12) >= 6, (4, 1)),
            "old_logprobs": np.full((4, 12), -4.0, np.float32), "ref_logprobs": np.full((4, 12), -4.0, np.float32),
            "advantages": np.array([1.0, -1.0, 0.5, -0.5], np.float32)}


def _adapter_leaves(tree, name):
    return [v for p, v in jax.tree_util.tree_leaves_with_path(tree) if p[-1].key == name]


@pytest.mark.parametrize("objective", ["sft", "grpo"])
def test_one_step_moves_the_adapter_only(objective):
    learner = _lora_learner()
    assert learner.trainable is nnx.LoRAParam
    base_before = _host(nnx.state(learner.model, BASE))
    adapter_before = _host(learner.params)
    n_adapter = sum(x.size for x in jax.tree.leaves(adapter_before))
    # r (in + out) per adapted projection: DeltaNet layer qkv 32→64, z 32→32, out 32→32; attention layer q 32→64,
    # k / v 32→16, o 32→32; MLPs 32→64→32 (gate, up, down) in both
    assert n_adapter == 4 * (96 + 64 + 64 + 96 + 48 + 48 + 64 + 2 * 3 * 96)
    opt = OptimizerConfig(learning_rate=1e-2, warmup_ratio=0.0)
    if objective == "sft":
        step, state = learner.sft_block(sft.SFTConfig(optimizer=opt, global_batch_size=4, total_steps=2), 2)
        batch = _sft_batch()
    else:
        step, state = learner.grpo_block(grpo.GRPOConfig(kl_coef=0.01), opt, total_steps=2)
        batch = _grpo_batch()
    # Adam's mu and nu for the adapter, nothing for the base: every other leaf is a scalar step counter
    moments = [x for x in jax.tree.leaves(state.opt_state) if x.ndim > 0]
    counters = [x for x in jax.tree.leaves(state.opt_state) if x.ndim == 0]
    assert sum(x.size for x in moments) == 2 * n_adapter and len(counters) == 2
    state, metrics = step(state, batch)
    assert np.isfinite(float(metrics["loss"])) and float(metrics["grad_norm"]) > 0
    learner.adopt(state)
    after = _host(learner.params)
    # B was 0, so dL/dA = 0 in the first step: A stays, every B moves
    jax.tree.map(np.testing.assert_array_equal, _adapter_leaves(after, "lora_a"),
                 _adapter_leaves(adapter_before, "lora_a"))
    assert all(np.abs(b).max() > 0 for b in _adapter_leaves(after, "lora_b"))
    jax.tree.map(np.testing.assert_array_equal, _host(nnx.state(learner.model, BASE)), base_before)
    state, _ = step(state, batch)  # the second step moves A too (B is no longer 0)
    assert all(np.any(a != b) for a, b in zip(_adapter_leaves(_host(state.params), "lora_a"),
                                              _adapter_leaves(adapter_before, "lora_a")))
    learner.adopt(state)
    jax.tree.map(np.testing.assert_array_equal, _host(nnx.state(learner.model, BASE)), base_before)
    model = learner.sync_model()
    jax.tree.map(np.testing.assert_array_equal, _host(nnx.state(model, nnx.LoRAParam)), _host(learner.params))


def test_a_fresh_adapter_gives_the_base_learners_logprobs():
    """The learner's reference logprobs (adapter + the frozen base) with B = 0 equal a full-weight learner's; the
    adapter is float32."""
    plain, adapted = Learner(_model("qwen3"), MeshConfig(data=1, fsdp=1, tensor=1)), _lora_learner(family="qwen3")
    batch, cfg = _grpo_batch(), grpo.GRPOConfig()
    # to float round-off only: the adapter's (zero) terms are other ops in the compiled program, fused differently
    np.testing.assert_allclose(adapted.logprobs(adapted.params, batch, cfg), plain.logprobs(plain.params, batch, cfg),
                               rtol=0, atol=2e-6)
    assert set(jax.tree.leaves(jax.tree.map(lambda x: x.dtype == jnp.float32, adapted.params))) == {True}


def test_sharded_lora_learner_gives_the_single_device_loss():
    """fsdp = 2 and data = 2 × fsdp = 2 × tensor = 2 (8 fake CPU devices) give the single device's loss and
    adapter after one SFT step, to 1e-5."""
    opt = OptimizerConfig(learning_rate=1e-2, warmup_ratio=0.0)
    results = []
    for mesh in (MeshConfig(data=1, fsdp=1, tensor=1), MeshConfig(data=1, fsdp=2, tensor=1),
                 MeshConfig(data=2, fsdp=2, tensor=2)):
        learner = _lora_learner(mesh)
        step, state = learner.sft_block(sft.SFTConfig(optimizer=opt, global_batch_size=4, total_steps=1), 1)
        state, metrics = step(state, _sft_batch())
        results.append((float(metrics["loss"]), _host(state.params), learner))
    (loss1, p1, _), (loss2, p2, l2), (loss8, p8, l8) = results
    wq = l2.frozen["model"]["layers"][1]["self_attn"]["q_proj"]["weight"]
    assert len(wq.sharding.device_set) == 2 and len(l8.frozen_shardings["model"]["embed_tokens"]["weight"]
                                                    .device_set) == 8
    for loss, params in ((loss2, p2), (loss8, p8)):
        assert loss == pytest.approx(loss1, abs=1e-5)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), params, p1)


def test_a_bf16_frozen_base_under_a_float32_adapter():
    """`LoRAConfig.base_dtype = 'bfloat16'`: every base leaf is bf16, the adapter and Adam's moments float32; the
    logits equal a model whose base was cast to bf16 by hand; one SFT step moves the adapter only."""
    config = lora.LoRAConfig(rank=4, alpha=8.0, base_dtype="bfloat16")
    model, by_hand = _model("qwen3"), _model("qwen3")
    lora.add_lora(model, config)
    lora.add_lora(by_hand, lora.LoRAConfig(rank=4, alpha=8.0))
    for path, leaf in jax.tree_util.tree_leaves_with_path(nnx.state(by_hand, BASE)):  # by hand: leaf by leaf
        assert leaf.dtype == jnp.float32, path
    nnx.update(by_hand, jax.tree.map(lambda x: x.astype(jnp.bfloat16), nnx.state(by_hand, BASE)))
    assert {x.dtype for x in jax.tree.leaves(nnx.state(model, BASE))} == {jnp.dtype(jnp.bfloat16)}
    assert {x.dtype for x in jax.tree.leaves(nnx.state(model, nnx.LoRAParam))} == {jnp.dtype(jnp.float32)}
    for m in (model, by_hand):  # the same non-zero B on both, so the adapter's term counts too
        rng = np.random.default_rng(5)
        for _, linear in lora.adapted_linears(m):
            linear.lora_b[...] = jnp.asarray(rng.normal(0, 0.05, linear.lora_b.shape), jnp.float32)
    ids, mask = _ids(), jnp.ones((3, 11), jnp.int32)
    np.testing.assert_allclose(np.asarray(model(ids, mask)), np.asarray(by_hand(ids, mask)), rtol=0, atol=1e-6)

    learner = Learner(model, MeshConfig(data=1, fsdp=1, tensor=1))
    assert {x.dtype for x in jax.tree.leaves(learner.frozen)} == {jnp.dtype(jnp.bfloat16)}
    base_before, adapter_before = _host(learner.frozen), _host(learner.params)
    opt = OptimizerConfig(learning_rate=1e-2, warmup_ratio=0.0)
    step, state = learner.sft_block(sft.SFTConfig(optimizer=opt, global_batch_size=4, total_steps=1), 1)
    moments = [x for x in jax.tree.leaves(state.opt_state) if x.ndim > 0]
    assert {x.dtype for x in moments} == {jnp.dtype(jnp.float32)}
    assert sum(x.size for x in moments) == 2 * sum(x.size for x in jax.tree.leaves(adapter_before))
    state, metrics = step(state, _sft_batch())
    assert np.isfinite(float(metrics["loss"]))
    learner.adopt(state)
    assert {x.dtype for x in jax.tree.leaves(learner.params)} == {jnp.dtype(jnp.float32)}
    assert all(np.abs(a - b).max() > 0 for a, b in zip(_adapter_leaves(_host(learner.params), "lora_b"),
                                                       _adapter_leaves(adapter_before, "lora_b")))
    jax.tree.map(np.testing.assert_array_equal, _host(learner.frozen), base_before)
    jax.tree.map(np.testing.assert_array_equal, _host(nnx.state(learner.model, BASE)), base_before)
    with pytest.raises(ValueError, match="base_dtype"):
        lora.LoRAConfig(base_dtype="int8")
