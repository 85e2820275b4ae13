"""Rollout speed: the embedded JAX sampler against transformers' `generate`, and agent-loop episodes per minute.

One run, one tiny random model (same config, same weights: the NNX model is written with
`bat_jax.models.hf_io.save_pretrained` and read back by transformers), same workload for both engines:
B prompts of P random tokens, N new tokens per row sampled at temperature 0.7 with no stop token, timed after a
warm-up call (so JAX compile time is excluded and reported apart). Prints tokens/s of

  * the JAX sampler (`JaxSampler`: prefill + `lax.while_loop` decode in one jitted program),
  * a Python loop over a jitted decode step (the alternative design, same model API),
  * transformers `generate` (torch CPU, `torch.set_num_threads(--threads)`),

and the ratio JAX / transformers (goal: >= 2). Then multi-turn episodes per minute of `AgentLoop` with
`LocalSandbox`es: (a) the JAX sampler as the policy (random weights, so turns end in tool-call parse errors that
come back as observations; sampling dominates), (b) a scripted policy that runs real `execute_code` calls
(sandbox + loop overhead only).

  python launch/bench/bench_rollout.py [--family qwen3] [--batch 8] [--prompt 64] [--new 128]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np


def build_models(family: str, vocab: int, tmp: str):
    from flax import nnx

    from bat_jax.models.configs import Qwen3_5Config, Qwen3Config
    from bat_jax.models.hf_io import save_pretrained
    from bat_jax.models.qwen3 import Qwen3ForCausalLM
    from bat_jax.models.qwen3_5 import Qwen3_5ForCausalLM

    common = dict(vocab_size=vocab, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=32)
    if family == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(**common), rngs=nnx.Rngs(0))
    else:
        model = Qwen3_5ForCausalLM(Qwen3_5Config(**common), rngs=nnx.Rngs(0))
    path = save_pretrained(model, os.path.join(tmp, "model"))
    return model, path


def bench_jax(model, prompts, new, repeats):
    from bat_jax.rollout.engine import SamplingParams
    from bat_jax.rollout.jax_sampler import JaxSampler

    sampler = JaxSampler(model, min_prompt_bucket=len(prompts[0]))
    params = SamplingParams(temperature=0.7, max_new_tokens=new)
    t0 = time.perf_counter()
    sampler.generate(prompts, params, seeds=range(len(prompts)))
    compile_s = time.perf_counter() - t0
    times = []
    for r in range(repeats):
        t0 = time.perf_counter()
        out = sampler.generate(prompts, params, seeds=[r * 1000 + i for i in range(len(prompts))])
        times.append(time.perf_counter() - t0)
    assert all(len(c.token_ids) == new for c in out)
    return len(prompts) * new / min(times), compile_s


def bench_jax_python_loop(model, prompts, new, repeats):
    """Same sampling, but a Python loop over a jitted (decode_step + sample) with a donated cache."""
    import functools

    import jax
    import jax.numpy as jnp
    from flax import nnx

    from bat_jax.rollout.engine import processed_logprobs

    graphdef, state = nnx.split(model)
    b, p = len(prompts), len(prompts[0])

    def sample(logits, key):
        logp = processed_logprobs(logits, 0.7)
        tok = jax.random.categorical(key, logp).astype(jnp.int32)
        return tok, jnp.take_along_axis(logp, tok[:, None], axis=-1)[:, 0]

    @jax.jit
    def prefill(state, ids, key):
        m = nnx.merge(graphdef, state)
        cache = m.init_cache(b, p + new)
        logits, cache = m.prefill(ids, jnp.ones_like(ids), cache)
        tok, lp = sample(logits[:, -1], key)
        return tok, lp, cache

    @functools.partial(jax.jit, donate_argnums=(2,))
    def step(state, tok, cache, key):
        m = nnx.merge(graphdef, state)
        logits, cache = m.decode_step(tok, cache)
        tok, lp = sample(logits, key)
        return tok, lp, cache

    ids = jnp.asarray(np.asarray(prompts, np.int32))

    def run(seed):
        key = jax.random.key(seed)
        tok, lp, cache = prefill(state, ids, jax.random.fold_in(key, 0))
        toks = [tok]
        for s in range(1, new):
            tok, lp, cache = step(state, tok, cache, jax.random.fold_in(key, s))
            toks.append(tok)
        return np.asarray(jnp.stack(toks, 1))

    t0 = time.perf_counter()
    run(0)
    compile_s = time.perf_counter() - t0
    times = []
    for r in range(repeats):
        t0 = time.perf_counter()
        run(r + 1)
        times.append(time.perf_counter() - t0)
    return b * new / min(times), compile_s


def bench_transformers(path, prompts, new, repeats, threads):
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.tensor(np.asarray(prompts, np.int64))
    kw = dict(do_sample=True, temperature=0.7, top_p=1.0, top_k=0, max_new_tokens=new, min_new_tokens=new,
              pad_token_id=0, eos_token_id=None)
    with torch.inference_mode():
        model.generate(ids, attention_mask=torch.ones_like(ids), **kw)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            out = model.generate(ids, attention_mask=torch.ones_like(ids), **kw)
            times.append(time.perf_counter() - t0)
    assert out.shape == (len(prompts), len(prompts[0]) + new), out.shape
    return len(prompts) * new / min(times)


def bench_episodes(model, episodes: int, turns: int, turn_tokens: int):
    """Episodes per minute of AgentLoop + LocalSandbox: (JAX-sampler policy, scripted tool-calling policy)."""
    from bat_jax.models.chat import ToolAction, render_action
    from bat_jax.models.episode import EpisodeBuilder
    from bat_jax.models.tokenizer import load_tiny_tokenizer
    from bat_jax.rollout.agent_loop import AgentLoop, AgentLoopConfig, RolloutRequest
    from bat_jax.rollout.engine import Completion
    from bat_jax.rollout.jax_sampler import JaxSampler
    from bat_jax.sandbox.local import LocalSandbox
    from bat_jax.sandbox.types import SandboxState

    tok = load_tiny_tokenizer()
    eot, im_start = tok.convert_tokens_to_ids(["<|im_end|>", "<|im_start|>"])
    request = RolloutRequest(state_id="bench", state=SandboxState(files={"data/x.txt": b"1 2 3\n"}),
                             system_prompt="You validate data before inference.",
                             user_message="Check data/x.txt and submit a summary.")
    config = AgentLoopConfig(episodes_per_state=episodes, max_assistant_turns=turns, max_tokens_per_turn=turn_tokens,
                             progress=False)
    builder = lambda: EpisodeBuilder(tok, "qwen3_5")  # noqa: E731

    loop = AgentLoop(JaxSampler(model), builder, LocalSandbox, config, extra_stop_ids=(im_start,))
    loop.run([request], seed=0)  # warm-up: compiles
    t0 = time.perf_counter()
    trajs = loop.run([request], seed=1)
    jax_epm = len(trajs) / (time.perf_counter() - t0) * 60
    jax_turns = np.mean([t.num_turns for t in trajs])

    action = ToolAction("Look at the data.", "execute_code", {"language": "python", "code":
                        "import numpy as np; print(np.loadtxt('data/x.txt').sum())"})
    act_ids = tok.encode(render_action(action, "qwen3_5"), add_special_tokens=False) + [eot]

    class Scripted:
        weight_version = 0

        def generate(self, prompts, params, *, max_new_tokens=None, seeds=None):
            return [Completion(np.asarray(act_ids, np.int32), np.zeros(len(act_ids), np.float32), "stop")
                    for _ in prompts]

    config = AgentLoopConfig(episodes_per_state=episodes, max_assistant_turns=turns,
                             max_response_tokens=10 ** 6, progress=False)
    t0 = time.perf_counter()
    trajs = AgentLoop(Scripted(), builder, LocalSandbox, config).run([request])
    scripted_epm = len(trajs) / (time.perf_counter() - t0) * 60
    calls = np.mean([t.num_tool_calls for t in trajs])
    return jax_epm, jax_turns, scripted_epm, calls


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", choices=["qwen3", "qwen3_5"], default="qwen3")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads")
    ap.add_argument("--episodes", type=int, default=8, help="episodes per agent-loop measurement")
    ap.add_argument("--turns", type=int, default=4, help="assistant turns per episode")
    ap.add_argument("--skip-python-loop", action="store_true")
    args = ap.parse_args(argv)

    from bat_jax.models.tokenizer import TINY_VOCAB_SIZE

    rng = np.random.default_rng(0)
    prompts = rng.integers(0, 3000, size=(args.batch, args.prompt)).tolist()
    with tempfile.TemporaryDirectory() as tmp:
        model, path = build_models(args.family, TINY_VOCAB_SIZE, tmp)
        print(f"model: tiny {args.family} (vocab {TINY_VOCAB_SIZE}, hidden 128, 4 layers), random weights; "
              f"workload: {args.batch} x ({args.prompt} prompt + {args.new} new) tokens, T=0.7, best of "
              f"{args.repeats}", flush=True)
        jax_tps, jax_compile = bench_jax(model, prompts, args.new, args.repeats)
        print(f"jax sampler (while_loop):      {jax_tps:9.1f} tok/s  (first call incl. compile {jax_compile:.1f} s)",
              flush=True)
        if not args.skip_python_loop:
            py_tps, py_compile = bench_jax_python_loop(model, prompts, args.new, args.repeats)
            print(f"jax python loop over jit step: {py_tps:9.1f} tok/s  (first call incl. compile "
                  f"{py_compile:.1f} s)", flush=True)
        hf_tps = bench_transformers(path, prompts, args.new, args.repeats, args.threads)
        print(f"transformers generate (torch): {hf_tps:9.1f} tok/s  ({args.threads} threads)", flush=True)
        print(f"ratio jax sampler / transformers: {jax_tps / hf_tps:.2f}x  (goal >= 2x)", flush=True)
    jax_epm, jax_turns, scripted_epm, calls = bench_episodes(model, args.episodes, args.turns, 32)
    print(f"agent loop, JAX-sampler policy + LocalSandbox: {jax_epm:7.1f} episodes/min "
          f"({args.episodes} concurrent, {jax_turns:.1f} turns of <= 32 tokens each)")
    print(f"agent loop, scripted tool calls + LocalSandbox: {scripted_epm:7.1f} episodes/min "
          f"({args.episodes} concurrent, {calls:.1f} execute_code calls each)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
