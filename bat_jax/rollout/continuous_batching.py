"""Continuous batching for the JAX sampler.

Rows join and leave a running decode batch between short chunks of decode steps.

Details: docs/design.md.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import threading
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bat_jax.rollout.engine import FINISH_LENGTH, FINISH_STOP, Completion, SamplingParams
from bat_jax.rollout.jax_sampler import JaxSampler, draw, stop_array
from bat_jax.rollout.prefix_cache import RowState, assemble, extract_rows


@functools.partial(jax.jit, static_argnames=("graphdef", "chunk", "layout"))
def _decode_chunk(state, cache, tok, live, steps, budgets, seeds, temperature, top_p, top_k, stop, *, graphdef,
                  chunk, layout=None):
    """At most `chunk` decode steps of a running batch; stops early once no row is live.

    Args:
      cache: the batch's `DecodeCache`.
      tok: `[B] int32`, each row's last sampled (not yet fed) token.
      live: `[B]` bool.
      steps: `[B] int32`, tokens each row has sampled so far (= the completion index of its next draw).
      budgets: `[B]` int32. seeds: `[B] uint32`.
      temperature, top_p: float32 scalars. top_k: an int32 scalar. stop: `[S] int32` (-1 unused).

    Returns (cache, tok, live, steps, ids `[B, chunk] int32`, logprobs `[B, chunk] float32`, stopped `[B]` bool,
    steps run: int32). A row's new ids are the first (steps_after − steps_before) entries of its ids row.
    layout: None (one device) or the rollout mesh's `CacheLayout` (slots split over its devices)."""
    model = nnx.merge(graphdef, state)
    constrain = (lambda c: c) if layout is None else layout.constrain
    keys = jax.vmap(jax.random.key)(seeds)
    b = tok.shape[0]

    def cond(carry):
        return (carry[0] < chunk) & jnp.any(carry[3])

    def body(carry):
        i, cache, tok, live, steps, out_ids, out_lp, stopped = carry
        logits, cache = model.decode_step(tok, cache, live=live)
        new, out_ids, out_lp, hit = draw(logits, keys, steps, i, live, out_ids, out_lp, stop, temperature, top_p,
                                         top_k)
        steps = steps + live.astype(jnp.int32)
        tok = jnp.where(live, new, tok)
        return i + 1, constrain(cache), tok, live & ~hit & (steps < budgets), steps, out_ids, out_lp, stopped | hit

    init = (jnp.int32(0), constrain(cache), tok, live, steps, jnp.zeros((b, chunk), jnp.int32),
            jnp.zeros((b, chunk), jnp.float32), jnp.zeros((b,), bool))
    n, cache, tok, live, steps, out_ids, out_lp, stopped = jax.lax.while_loop(cond, body, init)
    return cache, tok, live, steps, out_ids, out_lp, stopped, n


def _batch_key(params: SamplingParams) -> tuple:
    """What the rows of one running batch must share (per-row seeds and budgets may differ)."""
    return params.temperature, params.top_p, params.top_k, params.stop_token_ids


@dataclasses.dataclass(eq=False)
class _Row:
    """One requested completion while it is queued or decoding."""

    prompt: np.ndarray  # [n] int32
    budget: int
    seed: int
    params: SamplingParams
    ids: list = dataclasses.field(default_factory=list)
    logprobs: list = dataclasses.field(default_factory=list)
    finish: str | None = None
    error: BaseException | None = None
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    version: int | None = None  # the weight version the row was admitted (prefilled) on

    def fed(self) -> np.ndarray:
        """Tokens the row's decode state holds: its prompt and completion without the last (unfed) token."""
        return np.concatenate([self.prompt, np.asarray(self.ids[:-1], np.int32)])


class ContinuousBatchingSampler:
    """`RolloutEngine` that batches the rows of concurrent `generate` calls token by token (module docstring).

    Args:
      sampler: the `JaxSampler` whose model, weights, prefix store and compiled prefill it uses.
      slots: rows decoded together (the running batch; >= 1). Tiny default: 16.
      chunk_steps: decode steps between two admissions (>= 1): shorter chunks let returning episodes in sooner,
        longer ones pay the per-call overhead less often.
      headroom_chunks: chunks the cache can run between two rebuilds without admissions (slots beyond the longest
        row, rounded up to a multiple of `slot_step`).
      admit_rows: rows per prefill call of admitted rows (fewer are padded to it), min_prompt: fewest new tokens a
        prefill pads to, slot_step: cache sizes are multiples of it — coarse shapes, so that a run compiles a
        few dozen programs rather than hundreds (2 CPU cores: 1–3 s each).

    On a sampler with a rollout mesh (`JaxSampler(mesh=...)`) the slots and their cache are split over its data
    devices (`bat_jax.rollout.mesh_sampler`); `slots` must then be a multiple of them.

    Raises:
      ValueError: a bound < 1 (naming it), or slots that the rollout mesh's data devices do not divide.
    """

    def __init__(self, sampler: JaxSampler, *, slots: int = 16, chunk_steps: int = 16, headroom_chunks: int = 8,
                 admit_rows: int = 4, slot_step: int = 1024, min_prompt: int = 64):
        for name, value in (("slots", slots), ("chunk_steps", chunk_steps), ("headroom_chunks", headroom_chunks),
                            ("admit_rows", admit_rows), ("slot_step", slot_step), ("min_prompt", min_prompt)):
            if value < 1:
                raise ValueError(f"ContinuousBatchingSampler: {name} must be >= 1, got {value}")
        data = 1 if sampler.placement is None else sampler.placement.data
        if slots % data:
            raise ValueError(f"ContinuousBatchingSampler: slots = {slots} is not a multiple of the sampler mesh's "
                             f"{data} data devices")
        self.sampler = sampler
        self.slots, self.chunk_steps, self.headroom_chunks = int(slots), int(chunk_steps), int(headroom_chunks)
        self.admit_rows, self.slot_step, self.min_prompt = int(admit_rows), int(slot_step), int(min_prompt)
        self._queue: collections.deque[_Row] = collections.deque()
        self._lock = threading.Lock()  # guards the queue
        self._drive = threading.Lock()  # held by the one thread that drives the batch
        self._progress = threading.Condition()
        self._swap = threading.Event()  # a weight sync waits for the driver to stop between two chunks
        self._rows: list[_Row | None] = [None] * self.slots
        self._cache = None  # the batch's device DecodeCache (None: no row decoding)
        self._host_cache = None  # its numpy copy, once read back after a chunk (`_cache_on_host`)
        self._length = 0  # the device cache's write index (host copy)
        self.chunks = 0  # compiled decode chunks run (diagnostics)
        self.rebuilds = 0  # cache rebuilds (admissions and compactions)

    @property
    def weight_version(self) -> int:
        return self.sampler.weight_version

    swaps_in_flight = True  # `update_weights(..., in_flight=True)` (`rollout/weight_gate.WeightGate` uses it)

    def update_weights(self, params: Any, *, in_flight: bool = False) -> int:
        """`JaxSampler.update_weights` (clears the prefix store); returns the new weight version.

        Without `in_flight` it raises RuntimeError while rows are in flight. With it the sync waits for the driving
        thread to end its decode chunk, swaps the parameters between two chunks, and the rows in flight go on
        decoding on the new weights over the cache their old weights built (as an in-flight weight update does on an
        inference server); each row's `Completion.weight_version` stays the version it was admitted on, and its
        logprobs are as sampled (rollout correction weighs every token by them)."""
        if not in_flight:
            with self._lock:
                if self._queue or any(r is not None for r in self._rows):
                    raise RuntimeError("ContinuousBatchingSampler.update_weights: rows are still being generated")
                return self.sampler.update_weights(params)
        self._swap.set()  # the driver hands the batch over after its current chunk
        try:
            with self._drive, self._lock:
                return self.sampler.update_weights(params)
        finally:
            self._swap.clear()
            with self._progress:
                self._progress.notify_all()

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams, *,
                 max_new_tokens: Sequence[int] | None = None,
                 seeds: Sequence[int] | None = None) -> list[Completion]:
        """`RolloutEngine.generate`; safe to call from several threads at once (their rows share the batch).

        Raises the `JaxSampler.generate` ValueErrors for a bad request, and RuntimeError if decoding failed while
        this call's rows were in the batch (the driving thread re-raises the original exception)."""
        budgets, seeds = self.sampler.check_request(prompts, params, max_new_tokens, seeds)
        rows = [_Row(np.asarray(p, np.int32), b, s, params) for p, b, s in zip(prompts, budgets, seeds)]
        with self._lock:
            self._queue.extend(rows)
        while not all(r.done.is_set() for r in rows):
            if self._drive.acquire(blocking=False):
                try:
                    while not all(r.done.is_set() for r in rows) and not self._swap.is_set():
                        self._step()
                except BaseException as exc:
                    self._fail_all(exc)
                    raise
                finally:
                    self._drive.release()
                    with self._progress:
                        self._progress.notify_all()
            else:
                with self._progress:
                    self._progress.wait(timeout=0.05)
        for r in rows:
            if r.error is not None:
                raise RuntimeError("ContinuousBatchingSampler: decoding failed in another request") from r.error
        version = self.sampler.weight_version
        return [Completion(token_ids=np.asarray(r.ids, np.int32), logprobs=np.asarray(r.logprobs, np.float32),
                           finish_reason=r.finish, weight_version=version if r.version is None else r.version)
                for r in rows]

    # -- driving (one thread at a time) --------------------------------------------------------------------

    def _step(self) -> None:
        """Admit queued rows into free slots, rebuild the cache if needed, run one decode chunk."""
        admitted = self._admit()
        live = [i for i, r in enumerate(self._rows) if r is not None]
        if not live:
            self._cache = self._host_cache = None
            return
        if admitted or self._cache is None or self._length + self.chunk_steps > self._cache.max_len:
            self._rebuild(admitted)
        s = self.sampler
        rows = self._rows
        tok = np.zeros((self.slots,), np.int32)
        alive = np.zeros((self.slots,), bool)
        steps = np.zeros((self.slots,), np.int32)
        budgets = np.ones((self.slots,), np.int32)
        seeds = np.zeros((self.slots,), np.uint32)
        for i, r in enumerate(rows):
            if r is not None:
                tok[i], alive[i], steps[i], budgets[i] = r.ids[-1], True, len(r.ids), r.budget
                seeds[i] = r.seed % (1 << 32)
        params = next(r.params for r in rows if r is not None)
        stop_arr = stop_array(params.stop_token_ids)
        put = s.put_rows
        self._cache, _, live_after, steps_after, out_ids, out_lp, stopped, n = _decode_chunk(
            s._state, self._cache, put(tok), put(alive), put(steps), put(budgets), put(seeds),
            jnp.float32(params.temperature), jnp.float32(params.top_p), jnp.int32(params.top_k),
            jnp.asarray(stop_arr), graphdef=s._graphdef, chunk=self.chunk_steps, layout=s.layout)
        self._host_cache = None
        live_after, steps_after, out_ids, out_lp, stopped, n = jax.device_get(
            (live_after, steps_after, out_ids, out_lp, stopped, n))
        self.chunks += 1
        self._length += int(n)
        finished = []
        for i, r in enumerate(rows):
            if r is None:
                continue
            k = int(steps_after[i]) - int(steps[i])
            r.ids += out_ids[i, :k].tolist()
            r.logprobs += out_lp[i, :k].tolist()
            if not live_after[i]:
                r.finish = FINISH_STOP if stopped[i] else FINISH_LENGTH
                finished.append(i)
        if finished:
            self._store_states(finished)
            for i in finished:
                rows[i].done.set()
                rows[i] = None
        with self._progress:
            self._progress.notify_all()

    def _admit(self) -> list[tuple[int, _Row, RowState]]:
        """Prefills queued rows that fit in free slots and share the batch's sampling parameters.

        Rows that end at their first token are finished here. Returns (slot, row, state) of the rows that go on
        decoding."""
        free = [i for i, r in enumerate(self._rows) if r is None]
        running = next((r.params for r in self._rows if r is not None), None)
        with self._lock:
            key = _batch_key(running if running is not None else self._queue[0].params) if self._queue else None
            take = []
            for r in list(self._queue):
                if len(take) == len(free):
                    break
                if _batch_key(r.params) == key:
                    take.append(r)
                    self._queue.remove(r)
        out = []
        for lo in range(0, len(take), self.admit_rows):
            group = take[lo:lo + self.admit_rows]
            completions, states = self.sampler.prefill_rows(
                [r.prompt for r in group], group[0].params, [r.seed for r in group], min_rows=self.admit_rows,
                min_prompt=self.min_prompt, slot_step=self.slot_step)
            for r, c, state in zip(group, completions, states):
                r.ids, r.logprobs, r.version = c.token_ids.tolist(), c.logprobs.tolist(), c.weight_version
                if c.finish_reason == FINISH_STOP or r.budget == 1:
                    r.finish = c.finish_reason
                    if state is not None and self.sampler.prefix_cache is not None:
                        self.sampler.prefix_cache.put(state)
                    r.done.set()
                elif state is None:
                    raise RuntimeError("ContinuousBatchingSampler: a prefilled row's decode state could not be read")
                else:
                    slot = free.pop(0)
                    self._rows[slot] = r
                    out.append((slot, r, state))
        return out

    def _rebuild(self, admitted: list[tuple[int, _Row, RowState]]) -> None:
        """Assembles the batch's cache from the running rows' states and the admitted rows' prefilled states.

        The running rows' states are read back from the device cache. The write index goes to the longest row and
        `headroom_chunks` chunks of slots follow it."""
        states: list[RowState | None] = [None] * self.slots
        new = {slot: state for slot, _, state in admitted}
        if self._cache is not None:
            fed = [r.fed() if r is not None and i not in new else None for i, r in enumerate(self._rows)]
            for i, state in enumerate(extract_rows(self._cache_on_host(), fed)):
                if fed[i] is not None:
                    if state is None:
                        raise RuntimeError(f"ContinuousBatchingSampler: slot {i}'s decode state could not be read")
                    states[i] = state
        for slot, state in new.items():
            states[slot] = state
        longest = max(len(st.tokens) for st in states if st is not None)
        max_len = self.sampler.slots_for(longest + self.headroom_chunks * self.chunk_steps, self.slot_step)
        host = assemble(states, self.sampler.cache_template(self.slots, max_len))
        self._cache, self._host_cache = self.sampler.put_cache(host), host
        self._length = longest
        self.rebuilds += 1

    def _cache_on_host(self):
        """The batch cache as numpy arrays, copied from the device at most once per decode chunk.

        Finished rows' states are stored and the next step's rebuild reads the running rows from the same copy."""
        if self._host_cache is None:
            self._host_cache = jax.device_get(self._cache)
        return self._host_cache

    def _store_states(self, slots: list[int]) -> None:
        """Puts the finished rows' decode states into the sampler's prefix store (if it has one)."""
        store = self.sampler.prefix_cache
        if store is None:
            return
        fed = [self._rows[i].fed() if i in slots else None for i in range(self.slots)]
        for state in extract_rows(self._cache_on_host(), fed):
            if state is not None:
                store.put(state)

    def _fail_all(self, exc: BaseException) -> None:
        """Ends every queued and decoding row with `exc` and empties the batch."""
        with self._lock:
            pending = list(self._queue) + [r for r in self._rows if r is not None]
            self._queue.clear()
        for r in pending:
            r.error = exc
            r.done.set()
        self._rows = [None] * self.slots
        self._cache = self._host_cache = None


def jax_engine(model: Any, *, max_context: int, max_batch: int, prefix_cache_rows: int = 0,
               slots: int = 0, mesh: Any = None, devices: Any = None) -> JaxSampler | ContinuousBatchingSampler:
    """The embedded engine of a run or a Ray worker: a `JaxSampler`, optionally continuously batched.

    The `JaxSampler` has rows per compiled call `max_batch`, prefix store of `prefix_cache_rows` rows; on a rollout mesh
    with `mesh`, a `mesh_sampler.SamplerMeshConfig`, over `devices`. It is wrapped in a `ContinuousBatchingSampler` of
    `slots` rows when `slots` > 0. Then pair it with `AgentLoopConfig.max_generate_batch` = 1 and
    `max_concurrent_generate` >= the episodes in flight, so every episode's turn joins the batch on its own."""
    sampler = JaxSampler(model, max_context=max_context, max_batch=max_batch, prefix_cache_rows=prefix_cache_rows,
                         mesh=mesh, devices=devices)
    return ContinuousBatchingSampler(sampler, slots=slots) if slots > 0 else sampler
