"""What the rollout benchmarks share.

The tiny default's settings read from its gin file, the two agent loops they compare, real E2E tasks with the
scripted expert's actions, and a token-level replay of those actions.

Details: docs/design.md.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time

import numpy as np

#: The run file whose settings the benchmarks use ("the tiny default").
TINY_GIN = "bicurl_tiny.gin"


@functools.lru_cache(maxsize=None)
def tiny_default(bindings: tuple[str, ...] = ()):
    """`experiment.Components` as `gin/bicurl_tiny.gin` (plus `bindings`) binds it.

    Parsed by `bat_jax.launch.parse_gin`, the launch's own parser, which clears gin's global configuration first;
    it is cleared again afterwards, so nothing else in the process sees the tiny file (a bench, never inside a
    run). Cached per `bindings`.
    """
    import gin

    from bat_jax import launch
    from bat_jax.bicurl import experiment

    launch.parse_gin([TINY_GIN], list(bindings))
    try:
        return gin.get_configurable(experiment.Components)()
    finally:
        gin.clear_config(clear_constants=True)


def tiny_policy(**model_overrides):
    """The tiny default's policy (`policy.PolicyConfig` of the gin file: architecture, shape, dtype, seed, prompt
    style) with `model_overrides` applied to its model config (e.g. `chunk_size=64`)."""
    from bat_jax.policy import build_policy

    config = tiny_default().policy
    return build_policy(dataclasses.replace(config, tiny={**dict(config.tiny), **model_overrides}))


def tiny_jax_engine(model, max_context: int, mesh=None):
    """The tiny default's JAX engine (`engines.EngineConfig` of the gin file: rows per compiled call, stored prefixes,
    continuous-batching slots) on `model`, optionally on a rollout `mesh` (`SamplerMeshConfig`)."""
    from bat_jax.rollout.continuous_batching import jax_engine

    engine = tiny_default().engine
    return jax_engine(model, max_context=max_context, max_batch=engine.max_batch,
                      prefix_cache_rows=engine.prefix_cache_rows, slots=engine.slots, mesh=mesh)


@dataclasses.dataclass(frozen=True)
class Loop:
    """One way of running a batch of episodes: schedule, sandbox threads (0 = one per episode), warm pool or fresh
    containers, engine calls in flight (one call per ready turn) or one at a time."""

    name: str
    schedule: str
    max_workers: int
    warm: bool
    inflight: bool


#: The agent loop before the continuous schedule: per turn one engine call over every live episode, then all tool
#: calls on 16 threads, a fresh container per episode.
OLD = Loop("old", "lockstep", 16, warm=False, inflight=False)
#: The agent loop a run uses: each episode queued for its next turn as soon as its tool call returns, a thread per
#: episode, a warm pool, one engine call per ready turn in flight.
NEW = Loop("new", "continuous", 0, warm=True, inflight=True)


def agent_config(loop: Loop, base, episodes: int):
    """`base` (an `AgentLoopConfig`) run as `loop` over `episodes` concurrent episodes."""
    extra = dict(max_generate_batch=1, max_concurrent_generate=episodes) if loop.inflight else {}
    return dataclasses.replace(base, schedule=loop.schedule, max_workers=loop.max_workers, **extra)


def real_tasks(tracks: list[str], style: str = "full", expert: bool = True):
    """One E2E task per track (train layout, seed 11) with its agent-loop request and the expert's actions.

    Args:
      tracks: track names of the imaging suite.
      style: prompt style, 'full' or 'compact' (`bat_jax.prompts.request`).
      expert: record the scripted expert's actions on each task (with the local backend; a replay in another
        backend runs the same code); False gives empty action lists.

    Returns:
      A list of (RolloutRequest, actions), one per track.
    """
    from bat_jax.prompts import PromptFormat
    from bat_jax.prompts import request as policy_request
    from bat_jax.rollout.agent_loop import RolloutRequest
    from bat_jax.rollout.play import play
    from bat_jax.benchmarks.imaging.benchmark import ImagingBenchmark
    from bat_jax.benchmarks.imaging.registry import get_track
    from bat_jax.benchmarks.imaging.teacher import ScriptedExpert

    imaging = ImagingBenchmark()
    prompt = PromptFormat.of(imaging, style)
    skill = imaging.row_skill("E2E")
    out = []
    for name in tracks:
        inst = get_track(name).generate(seed=11)
        if style == "full":
            request = RolloutRequest(state_id=inst.task_id, state=inst.state(), system_prompt=imaging.system_prompt,
                                     user_message=prompt.user_message(inst.brief, skill), stage="E2E")
        else:
            request = policy_request(inst.task_id, inst.state(), inst.brief, skill, "E2E", prompt)
        turns = play(imaging, inst, ScriptedExpert()).episode.turns if expert else []
        actions = [t.action for t in turns if t.action.tool != "stop"]
        out.append((request, actions))
    return out


class ExpertReplay:
    """A token-level 'engine' that answers turn t of a task's episode with the expert's action t.

    The task is found by its id in the decoded prompt; the turn by the number of `<|im_start|>` tokens (system,
    user and the generation prompt, then two more per finished turn: the assistant's and the tool response's).
    """

    weight_version = 0

    def __init__(self, tokenizer, family: str, tasks):
        from bat_jax.models.chat import render_action

        eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.tokenizer, self.im_start = tokenizer, tokenizer.convert_tokens_to_ids("<|im_start|>")
        self.lock = threading.Lock()  # one tokenizer, calls from several generation threads
        self.turn_ids = {request.state_id: [tokenizer.encode(render_action(a, family), add_special_tokens=False)
                                            + [eot] for a in actions] for request, actions in tasks}

    def generate(self, prompts, params, *, max_new_tokens=None, seeds=None):
        from bat_jax.rollout.engine import Completion

        out = []
        for prompt in prompts:
            with self.lock:
                text = self.tokenizer.decode(prompt)
            turns = next(ids for task_id, ids in self.turn_ids.items() if task_id in text)
            t = (list(prompt).count(self.im_start) - 3) // 2
            ids = turns[min(t, len(turns) - 1)]
            out.append(Completion(np.asarray(ids, np.int32), np.zeros(len(ids), np.float32), "stop"))
        return out


def docker_answers() -> bool:
    """True when `docker info` answers within 30 s."""
    import subprocess

    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


class BusyMeter:
    """An engine wrapped to measure how long it decodes.

    `snapshot()` = (wall seconds with at least one `generate` call in flight, call-seconds in flight): their ratio
    to wall time is the mean number of concurrent calls, i.e. episodes decoding at once.
    """

    def __init__(self, inner):
        self.inner, self._lock, self._live, self._since = inner, threading.Lock(), 0, 0.0
        self.busy_s = self.call_s = 0.0

    @property
    def weight_version(self):
        return self.inner.weight_version

    def update_weights(self, params, **kwargs):
        return self.inner.update_weights(params, **kwargs)

    def __getattr__(self, name):
        """Anything else (e.g. a continuously batching engine's `swaps_in_flight`) is the inner engine's."""
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def _advance(self, now: float) -> None:
        if self._live:
            self.busy_s += now - self._since
            self.call_s += self._live * (now - self._since)
        self._since = now

    def snapshot(self) -> tuple[float, float]:
        with self._lock:
            self._advance(time.monotonic())
            return self.busy_s, self.call_s

    def generate(self, prompts, params, **kw):
        with self._lock:
            self._advance(time.monotonic())
            self._live += 1
        try:
            return self.inner.generate(prompts, params, **kw)
        finally:
            with self._lock:
                self._advance(time.monotonic())
                self._live -= 1
