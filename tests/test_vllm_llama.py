"""VLLMEngine (bat_jax.rollout.vllm_engine) on the real SmolLM2-135M-Instruct Llama: the converted GGUF
checkpoint (conftest `smollm2_dir`, float32) loads in vLLM's CPU engine, greedy decoding agrees with the JAX
sampler and transformers, and a weight sync after one real GRPO step in the JAX learner makes vLLM score a fixed
completion as JAX does.

The references are transformers' ``generate`` (greedy) and ``Learner.logprobs`` (the learner's own scoring of
the same tokens, temperature 1); vLLM's side of the logprob check is `VLLMEngine.score` (its prompt logprobs).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import REAL_PROMPT

pytest.importorskip("vllm")

from bat_jax.learn import grpo  # noqa: E402
from bat_jax.learn.batching import pad_batch  # noqa: E402
from bat_jax.learn.learner import Learner, MemoryConfig  # noqa: E402
from bat_jax.models.mesh import MeshConfig  # noqa: E402
from bat_jax.learn.optim import OptimizerConfig  # noqa: E402
from bat_jax.models import hf_io  # noqa: E402
from bat_jax.models.llama import LlamaForCausalLM  # noqa: E402
from bat_jax.rollout.engine import SamplingParams  # noqa: E402
from bat_jax.rollout.jax_sampler import JaxSampler  # noqa: E402
from bat_jax.rollout.sampling import SamplingConfig  # noqa: E402
from bat_jax.rollout.vllm_engine import VLLMEngine, VLLMEngineConfig  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

NEW_TOKENS = 32
# the learner's scoring at T = 1 (raw logprobs)
SCORE_CFG = grpo.GRPOConfig(kl_coef=0.0, sampling=SamplingConfig(temperature=1.0))


@pytest.fixture(scope="module")
def real(smollm2_dir):
    """(vLLM engine on the converted checkpoint, JAX model, tokenizer, REAL_PROMPT ids)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    ids = list(tokenizer.apply_chat_template(REAL_PROMPT, add_generation_prompt=True, tokenize=True)["input_ids"])
    engine = VLLMEngine(VLLMEngineConfig(model_dir=str(smollm2_dir), dtype="float32", max_model_len=1024,
                                         kv_cache_memory_bytes=64 << 20, max_num_seqs=8))
    yield engine, hf_io.load_pretrained(smollm2_dir), tokenizer, ids
    engine.close()


def test_greedy_32_tokens_equal_jax_sampler_and_transformers(smollm2_dir, real):
    from transformers import AutoModelForCausalLM

    engine, model, tokenizer, ids = real
    assert isinstance(model, LlamaForCausalLM)
    params = SamplingParams(temperature=0.0, max_new_tokens=NEW_TOKENS, stop_token_ids=(tokenizer.eos_token_id,))
    got = engine.generate([ids], params)[0]
    jax_out = JaxSampler(model).generate([ids], params)[0]
    torch_model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = torch_model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False,
                                   eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id)
    ref = ref[0, len(ids):].tolist()
    print(f"vLLM greedy: {tokenizer.decode(got.token_ids)!r}")
    assert len(ref) == NEW_TOKENS and got.finish_reason == "length" and got.weight_version == 0
    assert got.token_ids.tolist() == ref
    assert jax_out.token_ids.tolist() == ref
    assert len(set(ref)) > 10  # a real sentence, not a repeated token


def _grpo_rows(ids, completions, advantages):
    rows = []
    for comp, adv in zip(completions, advantages):
        seq = np.asarray(list(ids) + list(comp), np.int32)
        loss = np.zeros(len(seq), np.int32)
        loss[len(ids):] = 1
        rows.append({"input_ids": seq, "attention_mask": np.ones(len(seq), np.int32), "loss_mask": loss,
                     "old_logprobs": np.zeros(len(seq), np.float32), "ref_logprobs": np.zeros(len(seq), np.float32),
                     "advantages": np.float32(adv)})
    return pad_batch(rows, 1)


def test_weight_sync_after_a_grpo_step_matches_jax_logprobs(real):
    engine, model, _, ids = real
    # two fixed completions: the greedy one (advantage +1) and a sampled one (advantage -1)
    greedy = engine.generate([ids], SamplingParams(temperature=0.0, max_new_tokens=NEW_TOKENS))[0].token_ids
    sampled = engine.generate([ids], SamplingParams(temperature=1.0, max_new_tokens=NEW_TOKENS, seed=3))[0].token_ids
    comps = [greedy.tolist(), sampled.tolist()]
    assert comps[0] != comps[1]
    # parameters sharded over 2 of the 8 fake CPU devices: the sync gathers them (`stream_torch_weights`)
    learner = Learner(model, MeshConfig(data=1, fsdp=2, tensor=1), MemoryConfig(attention_block=0, logit_chunk=0))
    batch = _grpo_rows(ids, comps, [1.0, -1.0])
    sl = slice(len(ids), len(ids) + NEW_TOKENS)
    jax_before = learner.logprobs(learner.params, batch, SCORE_CFG)[:, sl]
    vllm_before = np.stack(engine.score([ids, ids], comps))
    np.testing.assert_allclose(vllm_before, jax_before, atol=1e-3)
    batch["old_logprobs"] = batch["ref_logprobs"] = learner.logprobs(learner.params, batch, SCORE_CFG)
    opt = OptimizerConfig(learning_rate=1e-5, schedule="constant", warmup_ratio=0.0)
    step, state = learner.grpo_block(SCORE_CFG, opt, total_steps=1)
    state, metrics = step(state, batch)
    assert float(metrics["grad_norm"]) > 0.0
    learner.adopt(state)
    jax_after = learner.logprobs(learner.params, batch, SCORE_CFG)[:, sl]
    version = engine.update_weights(learner.sync_model())
    assert version == 1
    vllm_after = np.stack(engine.score([ids, ids], comps))
    delta = np.abs(vllm_after - jax_after).max()
    shift = np.abs(vllm_after - vllm_before).max()
    print(f"|vLLM - JAX| after sync {delta:.2e}; before {np.abs(vllm_before - jax_before).max():.2e}; "
          f"step shift {shift:.3f}; mean shift (+A, -A) {(vllm_after - vllm_before).mean(1)}")
    np.testing.assert_allclose(vllm_after, jax_after, atol=1e-3)
    assert shift > 0.05  # the step moved the scores: vLLM is not still on the old weights
    # the step pushed the advantaged completion up and the other down
    assert (vllm_after - vllm_before)[0].mean() > 0 > (vllm_after - vllm_before)[1].mean()
    # and greedy decoding follows the new weights too (the sampler on the synced model object)
    after = engine.generate([ids], SamplingParams(temperature=0.0, max_new_tokens=NEW_TOKENS))[0]
    assert after.weight_version == 1
    assert after.token_ids.tolist() == JaxSampler(learner.sync_model()).generate(
        [ids], SamplingParams(temperature=0.0, max_new_tokens=NEW_TOKENS))[0].token_ids.tolist()
