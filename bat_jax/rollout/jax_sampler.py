"""The embedded rollout engine: batched, jit-compiled sampling from a Flax NNX causal LM.

Works with any model that has the `bat_jax.models.causal_lm` interface (`init_cache`, `prefill`,
`decode_step`): attention layers keep a fixed-size KV cache and Gated DeltaNet layers their recurrent state
(the model's `DecodeCache`). One call of `generate`:

Details: docs/design.md.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bat_jax.rollout.engine import FINISH_LENGTH, FINISH_STOP, Completion, SamplingParams, processed_logprobs
from bat_jax.rollout.mesh_sampler import CacheLayout, SamplerMeshConfig, SamplerPlacement
from bat_jax.rollout.prefix_cache import PrefixCache, RowState, assemble, extract_rows


def _bucket(n: int, minimum: int) -> int:
    """Smallest power of two >= max(n, minimum)."""
    n = max(int(n), int(minimum), 1)
    return 1 << (n - 1).bit_length()


def stop_array(stop_token_ids: Sequence[int]) -> np.ndarray:
    """The stop ids as the compiled programs take them, ``[n] int32``.

    ``n`` is a power of two ≥ 8, padded with -1 (never a token id), so a few stop-list lengths share one program."""
    out = np.full((_bucket(len(stop_token_ids), 8),), -1, np.int32)
    out[:len(stop_token_ids)] = stop_token_ids
    return out


def prompt_bucket(n: int, minimum: int, step: int) -> int:
    """Padded prompt length (tokens) for a longest prompt of `n` tokens.

    It is `_bucket(n, minimum)` up to `step`, above it the smallest multiple of `step` >= n, never below `minimum`
    (`step` = 0: powers of two throughout)."""
    p = _bucket(n, minimum)
    if step and p > step:
        p = max(-(-int(n) // step) * step, int(minimum))
    return p


def _sample(logits, keys, step, temperature, top_p, top_k):
    """One token per row from the processed distribution, by inverting its CDF at one uniform draw per row.

    u is in (0, 1]; the draw is the first id whose cumulative mass reaches u · total mass, so an id of probability 0 is
    never drawn. One random number per row instead of one per vocabulary entry (Gumbel-max): on 2 CPU cores, 8 rows of a
    3,584-token vocabulary, 0.28 instead of 0.66 ms per decode step. logits `[B, V]`, keys `[B]` typed PRNG keys, step:
    the completion index of the draw, a scalar or `[B] int32` per row (row i's draw at index s uses `fold_in(keys[i],
    s)`). Returns (ids `[B] int32`, logprobs `[B] float32`)."""
    logp = processed_logprobs(logits, temperature, top_p, top_k)
    steps = jnp.broadcast_to(jnp.asarray(step, jnp.int32), keys.shape)
    u = 1.0 - jax.vmap(lambda k, s: jax.random.uniform(jax.random.fold_in(k, s)))(keys, steps)
    cdf = jnp.cumsum(jnp.exp(logp), axis=-1)
    ids = jnp.sum(cdf < (u * cdf[:, -1])[:, None], axis=-1)
    ids = jnp.minimum(ids, logp.shape[-1] - 1).astype(jnp.int32)
    return ids, jnp.take_along_axis(logp, ids[:, None], axis=-1)[:, 0]


def draw(logits, keys, step, column, live, out_ids, out_lp, stop, temperature, top_p, top_k):
    """One sampling step of a batch, shared by `_generate` and the continuous batcher's decode chunk.

    Each row's token is drawn at completion index `step` (scalar or `[B]` int32; `_sample`), written with its logprob
    into column `column` of `out_ids` `[B, N] int32` / `out_lp` `[B, N] float32` (0 for rows not `live`, `[B]` bool).
    Returns (tokens `[B] int32`, out_ids, out_lp, hit_stop `[B]` bool: a live row drew one of `stop`)."""
    tok, lp = _sample(logits, keys, step, temperature, top_p, top_k)
    out_ids = out_ids.at[:, column].set(jnp.where(live, tok, 0))
    out_lp = out_lp.at[:, column].set(jnp.where(live, lp, 0.0))
    return tok, out_ids, out_lp, live & jnp.any(tok[:, None] == stop[None, :], axis=-1)


@functools.partial(jax.jit, static_argnames=("graphdef", "max_new", "max_len", "cache_dtype", "return_cache",
                                             "layout"))
def _generate(state, cache, prompt_ids, prompt_mask, budgets, seeds, temperature, top_p, top_k, stop, *, graphdef,
              max_new, max_len, cache_dtype, return_cache, layout=None):
    """Prefill + while-loop decode.

    cache: None (an empty cache of `max_len` slots is made) or a `DecodeCache` holding earlier tokens (prefix reuse).
    prompt_ids/prompt_mask `[B, P]` int32 (left padded; with a cache, the tokens after the cached ones). budgets `[B]`
    int32 (1..max_new), seeds `[B]` uint32, temperature/top_p float32 and top_k int32 scalars, stop `[S]` int32 (-1 =
    unused slot). Finished rows feed nothing more (`decode_step(live=...)`), so the final cache holds each row's prompt
    and completion without its last token. layout: None (one device) or the rollout mesh's `CacheLayout` (rows split
    over its devices). Returns ((ids `[B, N]`, logprobs `[B, N]`, lengths `[B]`, stopped `[B]`), final cache or None).
    """
    model = nnx.merge(graphdef, state)
    b, p = prompt_ids.shape
    keys = jax.vmap(jax.random.key)(seeds)
    constrain = (lambda c: c) if layout is None else layout.constrain
    if cache is None:
        cache = model.init_cache(b, max_len, cache_dtype)
    logits, cache = model.prefill(prompt_ids, prompt_mask, constrain(cache), last_only=True)
    cache = constrain(cache)

    def record(carry_bufs, step, logits_t, done):
        out_ids, out_lp, lengths, stopped = carry_bufs
        live = ~done
        tok, out_ids, out_lp, hit_stop = draw(logits_t, keys, step, step, live, out_ids, out_lp, stop,
                                              temperature, top_p, top_k)
        lengths = lengths + live.astype(jnp.int32)
        stopped = stopped | hit_stop
        done = done | hit_stop | (lengths >= budgets)
        return (out_ids, out_lp, lengths, stopped), tok, done

    bufs = (jnp.zeros((b, max_new), jnp.int32), jnp.zeros((b, max_new), jnp.float32),
            jnp.zeros((b,), jnp.int32), jnp.zeros((b,), bool))
    bufs, tok, done = record(bufs, 0, logits[:, -1], jnp.zeros((b,), bool))

    def cond(carry):
        step, _, _, done, _ = carry
        return (step < max_new) & ~jnp.all(done)

    def body(carry):
        step, bufs, tok, done, cache = carry
        logits_t, cache = model.decode_step(tok, cache, live=~done)
        bufs, tok, done = record(bufs, step, logits_t, done)
        return step + 1, bufs, tok, done, constrain(cache)

    _, bufs, _, _, cache = jax.lax.while_loop(cond, body, (jnp.int32(1), bufs, tok, done, cache))
    return bufs, (cache if return_cache else None)


def _on_one_device(x: Any) -> Any:
    """A jax array on several devices or a numpy array as a copy on this process's first device; else `x`."""
    if isinstance(x, jax.Array) and len(x.sharding.device_set) == 1 or not isinstance(x, (jax.Array, np.ndarray)):
        return x
    return jax.device_put(x, jax.local_devices()[0])


class JaxSampler:
    """`RolloutEngine` over an NNX causal LM (`Qwen3ForCausalLM` / `Qwen3_5ForCausalLM`).

    Args:
      model: the policy; its parameters are read at construction and replaced by `update_weights`.
      max_context: most tokens (prompt + new) one row may hold; default the config's
        `max_position_embeddings` (12,288 in the paper's runs, App. A.7, Table 8).
      min_prompt_bucket: smallest padded prompt length (tokens); prompts pad to powers of two above it.
      prompt_bucket_step: above this many tokens prompts pad to its multiples instead of powers of two (fewer
        wasted positions for long multi-turn prompts; one more compiled program per step). 0 = powers of two.
        Default 512: on the tiny Qwen3.5 (2 CPU cores, 8 rows) prefill of a 2,560-token bucket took 0.55× the
        time of a 4,096-token one.
      min_batch_bucket: smallest padded batch (rows); batches pad to powers of two above it.
      max_batch: most rows sampled in one compiled call; larger requests run in consecutive chunks of this
        size (bounds peak memory: prefill attention scores grow as rows × prompt²). 0 = no limit.
      cache_dtype: dtype of attention K/V and conv history (default: the model's compute dtype).
      pad_id: id written into left padding (never attended to).
      prefix_cache_rows: keep the decode state of up to this many finished rows (host memory) and continue a
        prompt that extends one of them instead of prefilling it again (`bat_jax.rollout.prefix_cache`: the
        turns of a multi-turn episode). 0 = off. Cleared by `update_weights`.
      mesh: None = one device; else a `SamplerMeshConfig`: rows split over its devices, weights replicated or
        tensor-sharded, made from the given parameters by an on-device reshard (`bat_jax.rollout.mesh_sampler`).
        Padded batches are then multiples of the data devices.
      devices: the devices of that mesh, in the learner mesh's order (default `jax.devices()`).
    """

    def __init__(self, model: nnx.Module, *, max_context: int | None = None, min_prompt_bucket: int = 16,
                 prompt_bucket_step: int = 512, min_batch_bucket: int = 1, max_batch: int = 0,
                 cache_dtype: Any = None, pad_id: int = 0, prefix_cache_rows: int = 0,
                 mesh: SamplerMeshConfig | None = None, devices: Sequence[jax.Device] | None = None):
        self._graphdef, self._state = nnx.split(model)
        self.placement = None if mesh is None else SamplerPlacement(self._state, mesh, devices)
        if self.placement is not None:
            self._state = self.placement.reshard(self._state)
        else:  # one device: a model whose parameters are on the learner's mesh (or host) gets its own copy there
            self._state = jax.tree.map(_on_one_device, self._state)
        cfg = getattr(model, "config", None)
        self.max_context = int(max_context or getattr(cfg, "max_position_embeddings", 32768))
        self.min_prompt_bucket = int(min_prompt_bucket)
        self.prompt_bucket_step = int(prompt_bucket_step)
        self.min_batch_bucket = int(min_batch_bucket)
        self.max_batch = int(max_batch)
        self.cache_dtype = jnp.dtype(cache_dtype or getattr(cfg, "dtype", "float32")).name
        self.pad_id = int(pad_id)
        self._version = 0
        self.prefix_cache = PrefixCache(prefix_cache_rows) if prefix_cache_rows else None
        self._templates: dict[tuple[int, int], Any] = {}

    @property
    def weight_version(self) -> int:
        return self._version

    def update_weights(self, params: Any) -> int:
        """Installs `params` and returns the new weight version.

        `params` is an `nnx.State` of the same structure as the model's (e.g. from the learner, any sharding: arrays are
        moved to the sampler's placement) or a model of the same architecture. Raises ValueError on a structure mismatch
        (naming differing parameter paths)."""
        new_state = nnx.state(params) if isinstance(params, nnx.Module) else params
        old_paths = {p for p, _ in nnx.to_flat_state(self._state)}
        new_paths = {p for p, _ in nnx.to_flat_state(new_state)}
        if old_paths != new_paths:
            diff = sorted(map(str, old_paths ^ new_paths))[:3]
            raise ValueError(f"update_weights: parameter structure differs from the model's, e.g. {diff}")
        if self.placement is not None:  # one jitted cast + reshard on the devices (mesh_sampler)
            self._state = self.placement.reshard(new_state)
        else:  # same dtype and placement as the weights compiled against: no recompile, no cross-mesh arrays
            self._state = jax.tree.map(lambda old, new: jax.device_put(jnp.asarray(new, old.dtype), old.sharding),
                                       self._state, new_state)
        if self.prefix_cache is not None:
            self.prefix_cache.clear()  # decode states of the old weights
        self._version += 1
        return self._version

    @property
    def layout(self) -> CacheLayout | None:
        """Where batch rows and decode caches live on the rollout mesh (None on one device)."""
        return None if self.placement is None else self.placement.layout

    def batch_rows(self, n: int, minimum: int = 1) -> int:
        """Padded rows of a batch of `n`.

        The next power of two >= max(n, minimum, `min_batch_bucket`), rounded up to a multiple of the rollout mesh's
        data devices."""
        b = _bucket(n, max(self.min_batch_bucket, minimum))
        data = 1 if self.placement is None else self.placement.data
        return -(-b // data) * data

    def put_rows(self, x: np.ndarray) -> jax.Array:
        """A host array with a leading batch axis on the sampler's devices (rows split over the mesh)."""
        if self.placement is None:
            return jnp.asarray(x)
        return jax.device_put(x, self.layout.batch(np.ndim(x)))

    def put_cache(self, cache):
        """A host `DecodeCache` on the sampler's devices (rows split over the mesh)."""
        if self.placement is None:
            return jax.tree.map(jnp.asarray, cache)
        return self.layout.put(cache)

    def memory_plan(self, rows: int, max_len: int | None = None, budget: int | None = None):
        """`mesh_sampler.plan_memory` of this sampler on its mesh running `rows` rows at once.

        Rows hold `max_len` tokens (default `max_context`). `budget`: bytes per device it may use (default: the free
        bytes of its first device, None on CPU). Raises ValueError without a mesh."""
        from bat_jax.rollout import mesh_sampler

        if self.placement is None:
            raise ValueError("JaxSampler.memory_plan: the sampler has no mesh (JaxSampler(mesh=...))")
        if budget is None:
            budget = mesh_sampler.free_device_bytes(self.placement.mesh.devices.flat[0])
        cache = self.cache_template(self.placement.data, max_len or self.max_context)
        return mesh_sampler.plan_memory(self.placement, self._state, cache, rows, budget)

    def cache_template(self, batch: int, max_len: int):
        """Shapes and dtypes of an empty `DecodeCache` of `batch` rows × `max_len` slots for this model.

        They are `jax.ShapeDtypeStruct`s, traced once per shape."""
        key = (int(batch), int(max_len))
        if key not in self._templates:
            self._templates[key] = jax.eval_shape(lambda: nnx.merge(self._graphdef, self._state).init_cache(
                key[0], key[1], self.cache_dtype))
        return self._templates[key]

    def slots_for(self, tokens: int, step: int = 0) -> int:
        """Cache slots that hold `tokens` tokens.

        A multiple of `step` (default `prompt_bucket_step`, or 512 when that is 0). Few distinct sizes, so few programs
        compile."""
        step = step or self.prompt_bucket_step or 512
        return -(-int(tokens) // step) * step

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams, *,
                 max_new_tokens: Sequence[int] | None = None,
                 seeds: Sequence[int] | None = None) -> list[Completion]:
        """Samples one completion per prompt (`bat_jax.rollout.engine.RolloutEngine.generate`).

        Raises ValueError naming the row for an empty prompt, a budget outside [1, params.max_new_tokens],
        or prompt + budget above `max_context`; and for a seeds / budgets list of the wrong length.
        """
        budgets, seeds = self.check_request(prompts, params, max_new_tokens, seeds)
        n = len(prompts)
        if n == 0:
            return []
        if self.max_batch and n > self.max_batch:  # memory bound: consecutive chunks, same per-row seeds
            out: list[Completion] = []
            for lo in range(0, n, self.max_batch):
                hi = lo + self.max_batch
                out += self.generate(prompts[lo:hi], params, max_new_tokens=budgets[lo:hi], seeds=seeds[lo:hi])
            return out
        completions, _ = self._call(prompts, params, budgets, seeds, keep_states=False)
        return completions

    def check_request(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                      max_new_tokens: Sequence[int] | None, seeds: Sequence[int] | None) -> tuple[list, list]:
        """The per-row budgets and seeds of a `generate` request (defaults filled in).

        They come after the checks `generate` documents. Raises ValueError naming the row."""
        n = len(prompts)
        budgets = [params.max_new_tokens] * n if max_new_tokens is None else [int(x) for x in max_new_tokens]
        seeds = [params.seed + i for i in range(n)] if seeds is None else [int(s) for s in seeds]
        if len(budgets) != n or len(seeds) != n:
            raise ValueError(f"generate: {n} prompts but {len(budgets)} budgets and {len(seeds)} seeds")
        for i, (prompt, budget) in enumerate(zip(prompts, budgets)):
            if len(prompt) == 0:
                raise ValueError(f"generate: prompt of row {i} is empty")
            if not 1 <= budget <= params.max_new_tokens:
                raise ValueError(f"generate: row {i} budget {budget} not in [1, {params.max_new_tokens}]")
            if len(prompt) + budget > self.max_context:
                raise ValueError(f"generate: row {i} prompt {len(prompt)} + budget {budget} tokens exceeds "
                                 f"max_context {self.max_context}")
        return budgets, seeds

    def prefill_rows(self, prompts: Sequence[Sequence[int]], params: SamplingParams, seeds: Sequence[int], *,
                     min_rows: int = 1, min_prompt: int = 0,
                     slot_step: int = 0) -> tuple[list[Completion], list[RowState | None]]:
        """Prefills `prompts` and samples each row's first token, as `generate` does.

        Stored prefixes are continued. The first token is drawn at completion index 0, so the draw is the one `generate`
        makes. Returns the one-token `Completion`s and each row's decode state holding its prompt (`RowState`; None if
        it could not be read back), for a caller that continues decoding (`bat_jax.rollout.continuous_batching`). Rows
        are not chunked by `max_batch`. Coarser padding compiles fewer programs: the batch pads to at least `min_rows`
        rows, new tokens to at least `min_prompt`, and a continued prefix's cache to a multiple of `slot_step` slots (0:
        `slots_for`'s default)."""
        return self._call(prompts, params, [1] * len(prompts), [int(s) for s in seeds], keep_states=True,
                          min_rows=min_rows, min_prompt=min_prompt, slot_step=slot_step)

    def _call(self, prompts, params, budgets, seeds, *, keep_states, min_rows=1, min_prompt=0, slot_step=0):
        """One compiled sampling call over at most a batch of rows (checked by the caller).

        Returns the completions and, with `keep_states`, the rows' final decode states (else they go to the prefix
        store, if any); `min_rows` / `min_prompt` / `slot_step` as in `prefill_rows`. If the call raises, the stored
        prefixes it took go back to the store (the next turn still continues them)."""
        reused = [None] * len(prompts) if self.prefix_cache is None else [self.prefix_cache.pop_longest(x)
                                                                          for x in prompts]
        try:
            return self._sample(prompts, reused, params, budgets, seeds, keep_states=keep_states, min_rows=min_rows,
                                min_prompt=min_prompt, slot_step=slot_step)
        except BaseException:
            for row in reused:
                if row is not None:
                    self.prefix_cache.put(row)
            raise

    def _sample(self, prompts, reused, params, budgets, seeds, *, keep_states, min_rows, min_prompt, slot_step):
        """`_call` after the stored prefixes `reused` (one per prompt, or None) were taken from the store."""
        n = len(prompts)
        feeds = [np.asarray(x, np.int32)[0 if r is None else len(r.tokens):] for x, r in zip(prompts, reused)]
        p = prompt_bucket(max(len(x) for x in feeds), max(self.min_prompt_bucket, min_prompt),
                          self.prompt_bucket_step)
        new = min(_bucket(max(budgets), 1), params.max_new_tokens)
        b = self.batch_rows(n, min_rows)
        held = max((len(r.tokens) for r in reused if r is not None), default=0)
        max_len = p + new
        if held:  # slots: the held tokens, then the new ones; sized in steps so few programs compile
            max_len = self.slots_for(held + p + new, slot_step)
        ids = np.full((b, p), self.pad_id, np.int32)
        mask = np.zeros((b, p), np.int32)
        for i, feed in enumerate(feeds):
            ids[i, p - len(feed):] = feed
            mask[i, p - len(feed):] = 1
        mask[n:, -1] = 1  # filler rows: one real token, budget 1
        budget_arr = np.ones((b,), np.int32)
        budget_arr[:n] = budgets
        seed_arr = np.zeros((b,), np.uint32)
        seed_arr[:n] = np.asarray(seeds, np.int64) % (1 << 32)
        stop_arr = stop_array(params.stop_token_ids)
        cache = self.put_cache(assemble(reused, self.cache_template(b, max_len))) if held else None
        put = self.put_rows
        (out_ids, out_lp, lengths, stopped), final = _generate(
            self._state, cache, put(ids), put(mask), put(budget_arr), put(seed_arr), jnp.float32(params.temperature),
            jnp.float32(params.top_p), jnp.int32(params.top_k), jnp.asarray(stop_arr), graphdef=self._graphdef,
            max_new=new, max_len=max_len, cache_dtype=self.cache_dtype,
            return_cache=keep_states or self.prefix_cache is not None, layout=self.layout)
        out_ids, out_lp, lengths, stopped = jax.device_get((out_ids, out_lp, lengths, stopped))
        states: list[RowState | None] = []
        if final is not None:
            fed = [np.concatenate([np.asarray(x, np.int32), out_ids[i, :lengths[i] - 1]]) for i, x in enumerate(prompts)]
            states = extract_rows(jax.device_get(final), fed)
            if not keep_states:
                for row in states:
                    if row is not None:
                        self.prefix_cache.put(row)
        return [Completion(token_ids=out_ids[i, :lengths[i]].copy(), logprobs=out_lp[i, :lengths[i]].copy(),
                           finish_reason=FINISH_STOP if stopped[i] else FINISH_LENGTH,
                           weight_version=self._version)
                for i in range(n)], states
