"""vLLM's own Qwen3.5 hybrid (Gated DeltaNet + gated attention) against bat_jax's, in one process of its own.

Run by tests/test_vllm_qwen3_5.py with tests/stubs on PYTHONPATH (the torchvision stand-in: vLLM's Qwen3.5 module
imports its vision processor even for the text model) and 2 fake CPU devices; prints one JSON line of measurements
(the last line of stdout) that the test asserts on.

Two kinds of evidence:
- the loader: vLLM's ``Qwen3_5ForCausalLM.load_weights`` is wrapped on the worker to record every tensor a weight
  sync hands it (name, shape, dtype) and the parameters it reports loaded; afterwards chosen parameters are read
  back from vLLM's model and compared with what the learner sent, bit for bit;
- the numerics: vLLM's CPU Gated DeltaNet kernel takes bf16 only, so the engine runs in bf16, as does the learner's
  compute (fp32 parameters, bf16 activations, as the paper-scale gin files run); greedy tokens are compared with the
  JAX sampler's and, after one GRPO step and the sync, vLLM's scores with the learner's.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from bat_jax.learn import grpo  # noqa: E402
from bat_jax.learn.learner import Learner, MemoryConfig  # noqa: E402
from bat_jax.models.mesh import MeshConfig  # noqa: E402
from bat_jax.learn.optim import OptimizerConfig  # noqa: E402
from bat_jax.models.configs import Qwen3_5Config  # noqa: E402
from bat_jax.models.qwen3_5 import Qwen3_5ForCausalLM  # noqa: E402
from bat_jax.rollout.engine import SamplingParams  # noqa: E402
from bat_jax.rollout.jax_sampler import JaxSampler  # noqa: E402
from bat_jax.rollout.sampling import SamplingConfig  # noqa: E402
from bat_jax.rollout.vllm_engine import VLLMEngine, checkpoint_tensor_shapes  # noqa: E402

# head dims 64: the smallest the CPU attention and Gated DeltaNet kernels take; layers 0-2 DeltaNet, 3 attention.
# Untied head scaled x3: next-token distributions peaked enough that bf16 round-off does not flip greedy choices.
CFG = Qwen3_5Config(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                    num_attention_heads=2, num_key_value_heads=1, head_dim=64, linear_key_head_dim=64,
                    linear_value_head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4,
                    max_position_embeddings=1024, tie_word_embeddings=False, dtype="bfloat16", param_dtype="float32")
SCORE = grpo.GRPOConfig(kl_coef=0.0, sampling=SamplingConfig(temperature=1.0))  # raw logprobs, as VLLMEngine.score
NEW = 16
READ_BACK = ("model.layers.0.linear_attn.A_log", "model.layers.1.linear_attn.norm.weight", "model.norm.weight",
             "model.layers.3.input_layernorm.weight")  # unfused in vLLM: compared bit for bit after the sync


def bf16_rounded(tree):
    return jax.tree.map(lambda x: x.astype(jnp.bfloat16).astype(x.dtype) if x.dtype == jnp.float32 else x, tree)


def build_model() -> Qwen3_5ForCausalLM:
    model = Qwen3_5ForCausalLM(CFG, rngs=nnx.Rngs(7))
    model.lm_head.weight.set_value(model.lm_head.weight.get_value() * 3.0)
    nnx.update(model, bf16_rounded(nnx.state(model, nnx.Param)))  # engine and learner start on equal weights
    return model


def record_loads(worker) -> None:
    """On the worker: wrap the model's ``load_weights`` to record what each weight sync hands it."""
    model = worker.model_runner.get_model()
    original = model.load_weights
    model.bat_received, model.bat_loaded = [], set()

    def load_weights(weights):
        def seen():
            for name, tensor in weights:
                model.bat_received.append((name, tuple(tensor.shape), str(tensor.dtype).removeprefix("torch.")))
                yield name, tensor

        loaded = original(seen())
        model.bat_loaded |= set(loaded or ())
        return loaded

    model.load_weights = load_weights


def load_report(worker) -> dict:
    model = worker.model_runner.get_model()
    params = dict(model.named_parameters())
    return {"received": model.bat_received, "unloaded": sorted(set(params) - model.bat_loaded),
            "read_back": {n: (str(params[n].dtype).removeprefix("torch."),
                              params[n].detach().float().cpu().numpy().tolist()) for n in READ_BACK}}


def named_params(model) -> dict[str, np.ndarray]:
    return {".".join(map(str, k)): np.asarray(v.get_value()) for k, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def rows(prompts, completions, advantages):
    seqs = [list(p) + list(c) for p, c in zip(prompts, completions)]
    ids = np.zeros((len(seqs), max(map(len, seqs))), np.int32)
    mask, loss = np.zeros_like(ids), np.zeros_like(ids)
    for i, (p, s) in enumerate(zip(prompts, seqs)):
        ids[i, : len(s)], mask[i, : len(s)], loss[i, len(p): len(s)] = s, 1, 1
    return {"input_ids": ids, "attention_mask": mask, "loss_mask": loss,
            "advantages": np.asarray(advantages, np.float32)}


def completion_logprobs(learner, batch, prompts, completions):
    lp = np.asarray(learner.logprobs(learner.params, batch, SCORE))
    return [lp[i, len(p): len(p) + len(c)] for i, (p, c) in enumerate(zip(prompts, completions))]


def max_abs(a, b) -> float:
    return float(max(np.abs(x - y).max() for x, y in zip(a, b)))


def main() -> int:
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, CFG.vocab_size, n).tolist() for n in (9, 14, 33)]
    model = build_model()
    initial = named_params(model)
    out: dict = {}
    with tempfile.TemporaryDirectory() as work:
        engine = VLLMEngine.from_model(model, work, dtype="bfloat16", max_model_len=256,
                                       kv_cache_memory_bytes=64 << 20, max_num_seqs=8)
        out["checkpoint"] = {k: list(v) for k, v in checkpoint_tensor_shapes(engine.config.model_dir).items()}
        greedy = SamplingParams(temperature=0.0, max_new_tokens=NEW)
        out["greedy_vllm"] = [c.token_ids.tolist() for c in engine.generate(prompts, greedy)]
        out["greedy_jax"] = [c.token_ids.tolist() for c in JaxSampler(model).generate(prompts, greedy)]

        # one GRPO step on two fixed completions (advantages +1 / -1), parameters sharded over 2 devices
        sampled = engine.generate(prompts[:2], SamplingParams(temperature=1.0, max_new_tokens=NEW, seed=3))
        completions = [out["greedy_vllm"][0], sampled[1].token_ids.tolist()]
        learner = Learner(model, MeshConfig(data=1, fsdp=2, tensor=1), MemoryConfig(attention_block=0, logit_chunk=0))
        batch = rows(prompts[:2], completions, [1.0, -1.0])
        before_jax = completion_logprobs(learner, batch, prompts[:2], completions)
        before_vllm = engine.score(prompts[:2], completions)
        out["before_max_abs_diff"] = max_abs(before_jax, before_vllm)
        ref = np.asarray(learner.logprobs(learner.params, batch, SCORE))
        batch.update(old_logprobs=ref, ref_logprobs=ref)
        step, state = learner.grpo_block(SCORE, OptimizerConfig(learning_rate=1e-4, schedule="constant",
                                                                warmup_ratio=0.0), total_steps=1)
        state, metrics = step(state, batch)
        out["grad_norm"] = float(metrics["grad_norm"])
        learner.adopt(state)

        engine._llm.collective_rpc(record_loads)
        out["weight_version"] = engine.update_weights(learner.sync_model())
        report = engine._llm.collective_rpc(load_report)[0]
        sent = named_params(learner.sync_model())
        out["received"] = report["received"]
        out["unloaded"] = report["unloaded"]
        out["read_back"] = {}
        for name, (dtype, value) in report["read_back"].items():
            want = sent[name].astype(jnp.dtype(dtype)).astype(np.float32)  # as vLLM stores it (its own dtype per parameter)
            out["read_back"][name] = {"dtype": dtype, "max_abs_diff": float(np.abs(np.asarray(value) - want).max()),
                                      "moved_by_step": float(np.abs(sent[name] - initial[name]).max())}

        after_vllm = engine.score(prompts[:2], completions)
        after_jax = completion_logprobs(learner, batch, prompts[:2], completions)
        out["after_max_abs_diff"] = max_abs(after_jax, after_vllm)
        out["step_shift_max"] = max_abs(after_vllm, before_vllm)
        out["step_shift_mean"] = [float((a - b).mean()) for a, b in zip(after_vllm, before_vllm)]
        after = engine.generate(prompts[:1], greedy)[0]
        out["greedy_after_version"] = after.weight_version
        out["greedy_after_vllm"] = after.token_ids.tolist()
        out["greedy_after_jax"] = JaxSampler(learner.sync_model()).generate(prompts[:1], greedy)[0].token_ids.tolist()
        engine.close()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
