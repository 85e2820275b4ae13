"""The embedded JAX sampler (bat_jax/rollout/jax_sampler.py) on tiny random Qwen3 (dense, KV cache) and Qwen3.5
(hybrid: Gated DeltaNet state + gated attention) models; the learner reproduces its sampled logprobs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from bat_jax.rollout.engine import SamplingParams, token_logprobs
from bat_jax.rollout.jax_sampler import JaxSampler
from doubles import SAMPLER_KW, tiny_model

_CACHE = {}


def model_and_sampler(family):
    """One tiny model and sampler per family for the whole module (their compiled programs are reused)."""
    if family not in _CACHE:
        model = tiny_model(family)
        _CACHE[family] = model, JaxSampler(model, **SAMPLER_KW)
    return _CACHE[family]


@pytest.fixture(scope="module")
def qwen3_sampler():
    return model_and_sampler("qwen3")[1]


def _learner_logprobs(model, prompts, completions, temperature, top_p, top_k):
    """What the learner does: one full forward over left-padded prompt+completion, shifted token_logprobs."""
    seqs = [list(p) + list(c.token_ids) for p, c in zip(prompts, completions)]
    t = max(map(len, seqs))
    ids = np.zeros((len(seqs), t), np.int32)
    mask = np.zeros((len(seqs), t), np.int32)
    for i, s in enumerate(seqs):
        ids[i, t - len(s):], mask[i, t - len(s):] = s, 1
    logits = nnx.jit(lambda m, i, k: m(i, k))(model, jnp.asarray(ids), jnp.asarray(mask))
    lp = np.asarray(token_logprobs(logits[:, :-1], jnp.asarray(ids[:, 1:]), temperature, top_p, top_k))
    return [lp[i, t - 1 - len(c.token_ids):] for i, c in enumerate(completions)]


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
def test_learner_reproduces_sampled_logprobs(family):
    """Importance ratios of freshly sampled tokens are 1 before any update (T 0.6, top-p 0.8)."""
    model, sampler = model_and_sampler(family)
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12, 13, 14]]
    params = SamplingParams(temperature=0.6, top_p=0.8, max_new_tokens=8, seed=3)
    out = sampler.generate(prompts, params)
    assert [len(c.token_ids) for c in out] == [8, 8] and all(c.finish_reason == "length" for c in out)
    learner = _learner_logprobs(model, prompts, out, 0.6, 0.8, 0)
    sampled = np.concatenate([c.logprobs for c in out])
    recomputed = np.concatenate(learner)
    assert np.all(sampled < 0) and np.all(sampled > -20)
    np.testing.assert_allclose(recomputed, sampled, atol=1e-4)
    ratios = np.exp(recomputed - sampled)
    assert abs(ratios.mean() - 1.0) < 0.01


@pytest.mark.parametrize("family", ["qwen3", pytest.param("qwen3_5", marks=pytest.mark.slow)])
def test_batched_equals_alone(family):
    """Prompts of lengths 3 and 5 in one batch (left padded to 8) give the tokens and logprobs of each run
    alone (padded to 4 and 8; the sampler adds a 1-token filler row to reach its minimum batch of 2)."""
    sampler = model_and_sampler(family)[1]
    prompts = [[21, 22, 23], [31, 32, 33, 34, 35]]
    params = SamplingParams(temperature=0.6, top_p=0.8, max_new_tokens=8)
    batch = sampler.generate(prompts, params, seeds=[11, 12])
    for prompt, seed, together in zip(prompts, [11, 12], batch):
        alone = sampler.generate([prompt], params, seeds=[seed])[0]
        np.testing.assert_array_equal(alone.token_ids, together.token_ids)
        np.testing.assert_allclose(alone.logprobs, together.logprobs, atol=1e-5)


def test_stop_tokens_budgets_and_seeds(qwen3_sampler):
    sampler = qwen3_sampler
    prompts = [[21, 22, 23], [31, 32, 33, 34, 35]]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8)
    ref = sampler.generate(prompts, greedy)
    np.testing.assert_array_equal(ref[0].logprobs, np.zeros(8, np.float32))  # greedy: one-hot distribution
    seq = ref[0].token_ids.tolist()
    stop = seq[3]
    first = seq.index(stop)
    out = sampler.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=8, stop_token_ids=(stop,)))
    assert out[0].token_ids.tolist() == seq[:first + 1] and out[0].finish_reason == "stop"
    other = ref[1].token_ids.tolist()
    cut = other.index(stop) + 1 if stop in other else 8
    assert out[1].token_ids.tolist() == other[:cut]
    assert out[1].finish_reason == ("stop" if stop in other else "length")
    # per-row budgets
    out = sampler.generate(prompts, greedy, max_new_tokens=[2, 5])
    assert [c.token_ids.tolist() for c in out] == [seq[:2], other[:5]]
    assert [c.finish_reason for c in out] == ["length", "length"]
    # seeded: same seed -> same tokens, another seed -> other tokens
    params = SamplingParams(temperature=1.0, max_new_tokens=8)
    a, b = (sampler.generate(prompts, params, seeds=s)[0] for s in ([1, 2], [1, 2]))
    c = sampler.generate(prompts, params, seeds=[7, 2])[0]
    np.testing.assert_array_equal(a.token_ids, b.token_ids)
    assert a.token_ids.tolist() != c.token_ids.tolist()
    with pytest.raises(ValueError, match="row 1 budget 9"):
        sampler.generate(prompts, greedy, max_new_tokens=[2, 9])
    with pytest.raises(ValueError, match="row 0 is empty"):
        sampler.generate([[]], greedy)


def test_update_weights():
    model = tiny_model("qwen3")
    sampler = JaxSampler(model, **SAMPLER_KW)
    params = SamplingParams(temperature=1.0, max_new_tokens=8)
    before = sampler.generate([[21, 22, 23]], params, seeds=[5])[0]
    other = tiny_model("qwen3", seed=1)
    assert sampler.update_weights(nnx.state(other)) == 1 and sampler.weight_version == 1
    after = sampler.generate([[21, 22, 23]], params, seeds=[5])[0]
    assert after.weight_version == 1
    expected = JaxSampler(other, **SAMPLER_KW).generate([[21, 22, 23]], params, seeds=[5])[0]
    np.testing.assert_array_equal(after.token_ids, expected.token_ids)
    np.testing.assert_array_equal(after.logprobs, expected.logprobs)
    assert not np.allclose(before.logprobs, after.logprobs)
    with pytest.raises(ValueError, match="structure"):
        sampler.update_weights(nnx.state(nnx.eval_shape(lambda: tiny_model("qwen3_5"))))


def test_max_batch_chunks_give_the_same_completions_as_one_call():
    """A memory-bounded sampler (max_batch) returns exactly what one big call returns (per-row seeds)."""
    from flax import nnx

    from bat_jax.models.configs import Qwen3Config
    from bat_jax.models.qwen3 import Qwen3ForCausalLM
    from bat_jax.rollout.engine import SamplingParams
    from bat_jax.rollout.jax_sampler import JaxSampler

    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=16, max_position_embeddings=64)
    model = Qwen3ForCausalLM(cfg, rngs=nnx.Rngs(0))
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10], [11, 12]]
    params = SamplingParams(temperature=0.8, max_new_tokens=4, seed=5)
    whole = JaxSampler(model).generate(prompts, params)
    chunked = JaxSampler(model, max_batch=2).generate(prompts, params)
    assert [c.token_ids.tolist() for c in whole] == [c.token_ids.tolist() for c in chunked]
    assert [c.finish_reason for c in whole] == [c.finish_reason for c in chunked]
    for a, b in zip(whole, chunked):
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)


def test_prompt_bucket_rounds_to_powers_of_two_then_to_multiples_of_the_step():
    from bat_jax.rollout.jax_sampler import prompt_bucket

    lengths = (1, 10, 300, 512, 513, 1000, 1025, 2500, 3072)
    assert [prompt_bucket(n, 16, 512) for n in lengths] == [16, 16, 512, 512, 1024, 1024, 1536, 2560, 3072]
    assert [prompt_bucket(n, 16, 0) for n in lengths] == [16, 16, 512, 512, 1024, 1024, 2048, 4096, 4096]
    assert prompt_bucket(9, 4, 4) == 12 and prompt_bucket(3, 4, 4) == 4
    assert prompt_bucket(10, 1024, 512) == 1024 and prompt_bucket(1100, 1024, 512) == 1536  # minimum holds


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
def test_step_buckets_and_last_only_prefill_give_the_same_completions(family):
    """A 9-token prompt padded to 12 (step 4) instead of 16 (powers of two) samples the same ids, logprobs equal
    to round-off; the sampler's last-position-only prefill gives the last row of the full prefill's logits."""
    model = model_and_sampler(family)[0]
    prompts = [list(range(40, 49)), [50, 51, 52]]
    params = SamplingParams(temperature=0.7, max_new_tokens=8, seed=9)
    pow2 = JaxSampler(model, min_prompt_bucket=4, prompt_bucket_step=0).generate(prompts, params)
    step = JaxSampler(model, min_prompt_bucket=4, prompt_bucket_step=4).generate(prompts, params)
    assert [c.token_ids.tolist() for c in step] == [c.token_ids.tolist() for c in pow2]
    for a, b in zip(step, pow2):
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
    ids = jnp.asarray([prompts[0]], jnp.int32)
    mask = jnp.ones_like(ids)
    full, _ = model.prefill(ids, mask, model.init_cache(1, 16))
    last, _ = model.prefill(ids, mask, model.init_cache(1, 16), last_only=True)
    assert last.shape == (1, 1, full.shape[-1])
    np.testing.assert_allclose(np.asarray(last[:, 0]), np.asarray(full[:, -1]), atol=1e-5)


def test_draws_follow_the_processed_distribution():
    """`_sample` (inverse CDF at one uniform per row): 40,000 draws of a 5-token distribution at T = 0.5 with
    top-k 3 land on each id with its processed probability (±0.01, > 6 standard errors) and never on a
    truncated id; each draw's logprob is its id's entry of the processed distribution."""
    from bat_jax.rollout.jax_sampler import _sample

    logits = jnp.log(jnp.array([0.1, 0.2, 0.3, 0.15, 0.25]))
    n = 40_000
    keys = jax.vmap(jax.random.key)(jnp.arange(n, dtype=jnp.uint32))
    ids, lps = _sample(jnp.broadcast_to(logits, (n, 5)), keys, 3, jnp.float32(0.5), jnp.float32(1.0), jnp.int32(3))
    ids = np.asarray(ids)
    kept = np.array([0.0, 0.2, 0.3, 0.0, 0.25]) ** 2  # tempered by T = 0.5, top-3: ids 2, 4, 1
    want = kept / kept.sum()
    np.testing.assert_allclose(np.bincount(ids, minlength=5) / n, want, atol=0.01)
    np.testing.assert_allclose(np.asarray(lps), np.log(want[ids]), rtol=1e-5)
