"""VLLMEngine (bat_jax.rollout.vllm_engine) against the JAX Qwen3 model as reference.

In-process vLLM engines (fp32, tiny Qwen3 dense: hidden 128, 2 layers, 2 heads of dim 64, vocab 512), one with a
tied output head (the project default, and Qwen3 up to 4B) and one untied, are started from checkpoints of weights
A and shared by the module; each test installs the weights it needs. A third serves a LoRA adapter (section below).
The reference is `bat_jax.models.qwen3.Qwen3ForCausalLM` on the same parameters, scored with
`bat_jax.rollout.engine.token_logprobs` (the project's definition of "logprob as sampled").
"""

from __future__ import annotations


import jax
import numpy as np
import pytest
from flax import nnx

pytest.importorskip("vllm")

from bat_jax.models import hf_io  # noqa: E402
from bat_jax.models.configs import Qwen3Config  # noqa: E402
from bat_jax.rollout.engine import SamplingParams  # noqa: E402
from bat_jax.rollout.vllm_engine import (CPU_BATCHED_TOKENS, VLLMEngine, VLLMEngineConfig,  # noqa: E402
                                         lora_rank_for)
from doubles import (VLLM_TINY, lora_reference_models, reference_logprobs, reference_logits,  # noqa: E402
                     set_random_adapter, vllm_reference_model)

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

CFG = Qwen3Config(**VLLM_TINY, tie_word_embeddings=True)


def _prompts(n: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, CFG.vocab_size, rng.integers(3, 11)).tolist() for _ in range(n)]


GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12)
# the last prompt fills a whole KV block (block_size 32 below), so a prefix cache left stale by a sync would be
# reused for it
GREEDY_PROMPTS = _prompts(2, seed=0) + [np.random.default_rng(3).integers(0, CFG.vocab_size, 40).tolist()]


def _start(tmp_path_factory, tied: bool):
    """(engine started on weights A, model A, model B, greedy completions of a fresh engine on A)."""
    model_a, model_b = vllm_reference_model(1, tied), vllm_reference_model(2, tied)
    ckpt = hf_io.save_pretrained(model_a, tmp_path_factory.mktemp("vllm") / "weights_a")
    engine = VLLMEngine(VLLMEngineConfig(model_dir=str(ckpt), dtype="float32", max_model_len=128,
                                         kv_cache_memory_bytes=32 << 20, max_num_seqs=32,
                                         block_size=32))
    return engine, model_a, model_b, engine.generate(GREEDY_PROMPTS, GREEDY)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """Tied output head."""
    s = _start(tmp_path_factory, tied=True)
    yield s
    s[0].close()


@pytest.fixture(scope="module")
def setup_untied(tmp_path_factory):
    """Separate lm_head (second engine in the same process; starts in about a second)."""
    s = _start(tmp_path_factory, tied=False)
    yield s
    s[0].close()


@pytest.mark.parametrize("which", ["setup", "setup_untied"])
def test_greedy_after_sync_equals_fresh_engine(request, which):
    engine, model_a, model_b, fresh = request.getfixturevalue(which)
    assert all(c.weight_version == 0 and c.finish_reason == "length" and len(c.token_ids) == 12 for c in fresh)
    v = engine.update_weights(nnx.state(model_b, nnx.Param))
    on_b = engine.generate(GREEDY_PROMPTS, GREEDY)
    assert all(c.weight_version == v for c in on_b)
    assert any(not np.array_equal(b.token_ids, a.token_ids) for a, b in zip(fresh, on_b))
    # every greedy token is the reference argmax under B (up to float round-off at near-ties)
    for lg, c in zip(reference_logits(model_b, GREEDY_PROMPTS, [c.token_ids for c in on_b]), on_b):
        np.testing.assert_allclose(lg[np.arange(len(c.token_ids)), c.token_ids], lg.max(-1), atol=1e-4)
        np.testing.assert_array_equal(c.logprobs, np.zeros(12, np.float32))  # one-hot limit at T == 0
    assert engine.update_weights(model_a) == v + 1  # back to A, given as a module this time
    again = engine.generate(GREEDY_PROMPTS, GREEDY)
    for a, b in zip(fresh, again):
        np.testing.assert_array_equal(b.token_ids, a.token_ids)


@pytest.mark.parametrize("which", ["setup", "setup_untied"])
def test_logprobs_match_reference_after_sharded_sync(request, which):
    engine, _, model_b, _ = request.getfixturevalue(which)
    # B's parameters sharded over the 8 fake CPU devices (conftest): the sync gathers each onto one device
    mesh = jax.make_mesh((8,), ("x",))

    def shard(x):
        spec = jax.sharding.PartitionSpec("x") if x.shape[0] % 8 == 0 else jax.sharding.PartitionSpec()
        return jax.device_put(x, jax.sharding.NamedSharding(mesh, spec))

    state = jax.tree.map(shard, nnx.state(model_b, nnx.Param))
    assert any(len(leaf.sharding.device_set) == 8 for leaf in jax.tree.leaves(state))
    engine.update_weights(state)
    prompts = _prompts(4, seed=1)
    comps = engine.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=24, seed=5))
    ref = reference_logprobs(model_b, prompts, [c.token_ids for c in comps])
    scored = engine.score(prompts, [c.token_ids for c in comps])  # teacher-forced, raw = sampled at T = 1
    for r, c, s in zip(ref, comps, scored):
        assert len(c.token_ids) == 24
        np.testing.assert_allclose(c.logprobs, r, atol=1e-3)
        np.testing.assert_allclose(s, r, atol=1e-3)


def test_importance_ratio_at_temperature_and_top_p(setup):
    engine, _, model_b, _ = setup
    engine.update_weights(model_b)
    params = SamplingParams(temperature=0.6, top_p=0.8, max_new_tokens=32, seed=11)
    prompts = _prompts(16, seed=2)
    comps = engine.generate(prompts, params)
    got = np.concatenate([c.logprobs for c in comps])
    ref = np.concatenate(reference_logprobs(model_b, prompts, [c.token_ids for c in comps], 0.6, 0.8))
    raw = np.concatenate(reference_logprobs(model_b, prompts, [c.token_ids for c in comps]))
    ratio = np.exp(ref - got)
    assert got.size == 16 * 32
    assert abs(ratio.mean() - 1.0) < 0.01, (ratio.mean(), np.abs(ref - got).max())
    # the check discriminates: processed logprobs differ from the raw ones, and nuclei hold several tokens
    assert np.abs(got - raw).mean() > 0.05
    assert (got < -1e-3).mean() > 0.1


def test_stop_tokens_budgets_and_seeds(setup):
    engine, _, model_b, _ = setup
    engine.update_weights(model_b)
    prompt = GREEDY_PROMPTS[0]
    full = engine.generate([prompt], GREEDY)[0].token_ids
    k = next(i for i in range(3, len(full)) if full[i] not in full[:i])  # first new token from position 3
    stop = engine.generate([prompt], SamplingParams(temperature=0.0, max_new_tokens=12,
                                                    stop_token_ids=(int(full[k]),)))[0]
    assert stop.finish_reason == "stop"
    np.testing.assert_array_equal(stop.token_ids, full[:k + 1])  # stop token kept as the last token
    short = engine.generate([prompt, prompt], GREEDY, max_new_tokens=[5, 12])
    assert [len(c.token_ids) for c in short] == [5, 12] and short[0].finish_reason == "length"
    # a row's tokens depend on its prompt and seed, not on the other rows
    params = SamplingParams(temperature=1.0, max_new_tokens=16)
    batch = engine.generate(GREEDY_PROMPTS, params, seeds=[7, 8, 9])
    alone = engine.generate([GREEDY_PROMPTS[1]], params, seeds=[8])[0]
    np.testing.assert_array_equal(alone.token_ids, batch[1].token_ids)
    other = engine.generate([GREEDY_PROMPTS[1]], params, seeds=[80])[0]
    assert not np.array_equal(other.token_ids, alone.token_ids)


def test_concurrent_calls_join_the_running_batch(setup):
    """Three threads call `generate` at once (rows of 4, 16 and 16 tokens): each gets the tokens one batched call
    gives (a row depends on its prompt, seed and the weights only), and the engine took fewer steps than the three
    calls one after another would (36): their rows ran in one batch (`bat_jax.rollout.inflight`)."""
    import threading

    engine, _, model_b, _ = setup
    engine.update_weights(model_b)
    params = SamplingParams(temperature=1.0, max_new_tokens=16)
    budgets = [4, 16, 16]
    batch = engine.generate(GREEDY_PROMPTS, params, seeds=[7, 8, 9], max_new_tokens=budgets)
    start, out = threading.Barrier(3), {}

    def call(i):
        start.wait()
        out[i] = engine.generate([GREEDY_PROMPTS[i]], params, seeds=[7 + i], max_new_tokens=[budgets[i]])[0]

    before = engine._driver.steps
    threads = [threading.Thread(target=call, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for i in range(3):
        np.testing.assert_array_equal(out[i].token_ids, batch[i].token_ids)
        np.testing.assert_allclose(out[i].logprobs, batch[i].logprobs, atol=1e-5)
    assert [len(out[i].token_ids) for i in range(3)] == budgets
    assert engine._driver.steps - before < sum(budgets)


def test_bad_input_raises(setup):
    engine, _, model_b, _ = setup
    version = engine.weight_version
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        engine.generate([[1, 2], []], GREEDY)
    with pytest.raises(ValueError, match="prompt 0 has 117 tokens"):
        engine.generate([[1] * 117], GREEDY)  # 117 + 12 > max_model_len 128
    assert engine.generate([], GREEDY) == []
    with pytest.raises(ValueError, match="row 1 has an empty completion"):
        engine.score([[1, 2], [3]], [[4], []])
    with pytest.raises(ValueError, match="row 0 has 100 \\+ 28 tokens"):
        engine.score([[1] * 100], [[2] * 28])  # 100 + 28 + 1 > max_model_len 128
    with pytest.raises(ValueError, match="2 prompts but 1 completions"):
        engine.score([[1], [2]], [[3]])
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.generate([[1, 2]], GREEDY, max_new_tokens=[13])
    state = dict(nnx.to_flat_state(nnx.state(model_b, nnx.Param)))
    named = {".".join(map(str, k)): v.get_value() for k, v in state.items()}
    with pytest.raises(ValueError, match=r"missing \['model.norm.weight'\]"):
        engine.update_weights({k: v for k, v in named.items() if k != "model.norm.weight"})
    with pytest.raises(ValueError, match=r"unknown \['lm_head.weight'\]"):  # the head is tied here
        engine.update_weights({**named, "lm_head.weight": named["model.embed_tokens.weight"]})
    with pytest.raises(ValueError, match="model.norm.weight.*shape"):
        engine.update_weights({**named, "model.norm.weight": np.ones(64, np.float32)})
    with pytest.raises(TypeError, match="nnx.Module, nnx.State or a mapping"):
        engine.update_weights([1, 2])
    assert engine.weight_version == version


def test_from_model_greedy_equals_jax_sampler(tmp_path):
    """`VLLMEngine.from_model` on an in-memory model over the tiny tokenizer's vocabulary: the checkpoint (with
    the tokenizer files) lands in work_dir/checkpoint, and greedy completions equal the JAX sampler's token for
    token (fp32 both sides; the peaked head of `vllm_reference_model` keeps near-ties out)."""
    from bat_jax.models.tokenizer import TINY_VOCAB_SIZE, load_tiny_tokenizer
    from bat_jax.rollout.jax_sampler import JaxSampler

    tokenizer = load_tiny_tokenizer()
    model = vllm_reference_model(4, tied=True, vocab_size=TINY_VOCAB_SIZE)
    prompts = [tokenizer.encode("import numpy as np\nprint(np.load('x.npy').shape)", add_special_tokens=False),
               tokenizer.encode("Validate the input cases before inference.", add_special_tokens=False)]
    engine = VLLMEngine.from_model(model, tmp_path / "work", tokenizer=tokenizer, kv_cache_memory_bytes=32 << 20,
                                   max_num_seqs=8, block_size=32)
    try:
        got = engine.generate(prompts, GREEDY)
    finally:
        engine.close()
    ckpt = tmp_path / "work" / "checkpoint"
    assert engine.config.model_dir == str(ckpt)
    assert engine.config.max_model_len == 1024  # min(4096, CFG.max_position_embeddings)
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in ckpt.iterdir()}
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == ["checkpoint"]  # no temporary left
    assert load_tiny_tokenizer(ckpt).encode("submit outputs/pred") == tokenizer.encode("submit outputs/pred")
    want = JaxSampler(model).generate(prompts, GREEDY)
    for g, w in zip(got, want):
        assert len(g.token_ids) == 12 and g.finish_reason == "length"
        np.testing.assert_array_equal(g.token_ids, w.token_ids)
        np.testing.assert_array_equal(g.logprobs, w.logprobs)  # both 0: the one-hot limit at T == 0
    assert len(set(np.concatenate([c.token_ids for c in got]).tolist())) > 3  # not a repeated token


def test_seeded_prompts_past_one_steps_token_budget_sample_what_they_sample_alone(tmp_path):
    """Five seeded prompts of 1,000 tokens in one call (more than one step's 4,096-token budget on the CPU backend):
    every row gets what it gets alone. vLLM's CPU backend fails an engine step that splits a seeded request's prefill
    ("CPU Generator does not use offset"); the engine prefills every prompt in one step."""
    model = vllm_reference_model(4, tied=True)
    engine = VLLMEngine.from_model(model, tmp_path / "work", kv_cache_memory_bytes=32 << 20, max_num_seqs=8,
                                   block_size=32)
    try:
        rng = np.random.default_rng(5)
        prompts = [rng.integers(0, CFG.vocab_size, 1000).tolist() for _ in range(5)]
        params = SamplingParams(temperature=1.0, max_new_tokens=8)
        batch = engine.generate(prompts, params, seeds=[10, 11, 12, 13, 14])
        alone = [engine.generate([prompts[i]], params, seeds=[10 + i])[0] for i in (0, 4)]
    finally:
        engine.close()
    assert engine.config.max_model_len == 1024 and 5 * 1000 > CPU_BATCHED_TOKENS
    assert all(len(c.token_ids) == 8 for c in batch)
    for i, one in zip((0, 4), alone):
        np.testing.assert_array_equal(one.token_ids, batch[i].token_ids)


def test_from_model_rejects_bad_overrides(tmp_path):
    model = vllm_reference_model(4)
    with pytest.raises(ValueError, match="other than model_dir"):
        VLLMEngine.from_model(model, tmp_path, model_dir="/elsewhere")
    with pytest.raises(ValueError, match=r"\['max_len'\]"):
        VLLMEngine.from_model(model, tmp_path, max_len=64)
    with pytest.raises(ValueError, match="VLLMEngineConfig.dtype"):
        VLLMEngine.from_model(model, tmp_path, dtype="int8")
    assert not any(tmp_path.iterdir())  # nothing written before the config is valid


# --- serving a LoRA adapter (`VLLMEngineConfig.max_lora_rank`): vLLM over the frozen base. The reference is the JAX
# Qwen3 with its adapter (`bat_jax.models.lora`) on the same parameters. Started on adapter A, then two syncs (every A
# and B matrix changed); after each, vLLM's sampled logprobs equal the JAX model's within this module's tolerance
# (1e-3), the prefix cache serves the new adapter, and only the newest adapter directory is left.
LORA_RNG = np.random.default_rng(5)
LORA_PROMPTS = [LORA_RNG.integers(0, 512, n).tolist() for n in (4, 9)] + [LORA_RNG.integers(0, 512, 40).tolist()]
LORA_COMPLETIONS = [LORA_RNG.integers(0, 512, 6).tolist() for _ in LORA_PROMPTS]
LORA_SAMPLE = SamplingParams(temperature=1.0, max_new_tokens=8, seed=3)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    model, base = lora_reference_models()
    work = tmp_path_factory.mktemp("vllm_lora")
    engine = VLLMEngine.from_model(model, work, dtype="float32", max_model_len=128, kv_cache_memory_bytes=32 << 20,
                                   max_num_seqs=16, block_size=32)
    yield engine, model, base, work
    engine.close()


def _check_lora(engine, model):
    sampled = engine.generate(LORA_PROMPTS, LORA_SAMPLE)
    for c, want in zip(sampled, reference_logprobs(model, LORA_PROMPTS, [c.token_ids for c in sampled])):
        np.testing.assert_allclose(c.logprobs, want, atol=1e-3)
    return sampled


def test_the_engine_starts_on_the_frozen_base_and_serves_the_models_adapter(served):
    engine, model, base, work = served
    assert engine.config.max_lora_rank == 8 and engine.weight_version == 0  # rank 4 fits vLLM's rank 8
    sampled = _check_lora(engine, model)
    plain = reference_logprobs(base, LORA_PROMPTS, [c.token_ids for c in sampled])
    assert max(float(np.abs(c.logprobs - p).max()) for c, p in zip(sampled, plain)) > 0.1  # the adapter matters
    assert sorted(p.name for p in (work / "adapters").iterdir()) == ["v0"]


def test_two_syncs_load_each_new_adapter_in_place(served):
    engine, model, _, work = served
    before = engine.generate(LORA_PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=8))  # fills the prefix cache
    for version, seed in ((1, 2), (2, 3)):
        set_random_adapter(model, seed)
        assert engine.update_weights(model) == version == engine.weight_version
        sampled = _check_lora(engine, model)
        assert all(c.weight_version == version for c in sampled)
        assert sorted(p.name for p in (work / "adapters").iterdir()) == [f"v{version}"]
    after = engine.generate(LORA_PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=8))
    assert any(list(a.token_ids) != list(b.token_ids) for a, b in zip(after, before))


def test_a_model_without_its_adapter_is_refused_and_nothing_changes(served):
    engine, model, _, _ = served
    version = engine.weight_version
    with pytest.raises(ValueError, match="without an adapter"):
        engine.update_weights(vllm_reference_model(1, tied=False))
    with pytest.raises(TypeError, match="nnx.Module"):
        engine.update_weights(nnx.state(model))
    assert engine.weight_version == version
    _check_lora(engine, model)


def test_scoring_through_a_cpu_lora_engine_is_refused_in_one_line(served):
    with pytest.raises(NotImplementedError, match="CPU backend"):
        served[0].score(LORA_PROMPTS, LORA_COMPLETIONS)


def test_vllm_rank_is_the_smallest_that_holds_the_adapter():
    assert [lora_rank_for(r) for r in (1, 2, 8, 9, 32, 300, 512)] == [1, 8, 8, 16, 32, 320, 512]
    with pytest.raises(ValueError, match="up to 512"):
        lora_rank_for(513)
    with pytest.raises(ValueError, match="max_lora_rank"):
        VLLMEngineConfig(model_dir="x", max_lora_rank=4)
