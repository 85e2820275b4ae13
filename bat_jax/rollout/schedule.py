"""The order in which the agent loop advances its episodes: lockstep turns or continuous scheduling.

Details: docs/design.md.
"""

from __future__ import annotations

import collections
import concurrent.futures
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

#: Names of the schedules (`AgentLoopConfig.schedule`).
EPISODE_SCHEDULES = ("continuous", "lockstep")


class EpisodeSteps(NamedTuple):
    """The agent loop's steps of one `run_episodes` call, as the schedules call them.

    Attributes:
      prepare: `(episodes) -> job | None`, main thread: the engine request for the next turn of the given
        episodes (those out of token budget end instead); None when none asks for a turn.
      generate: `(job) -> completions`, any thread: the one engine call of a job.
      absorb: `(job, completions) -> None`, main thread: appends the sampled turns and leaves each episode ended,
        with a pending tool call, or ready again (a parse error's observation appended).
      open: `(episode) -> None`, worker thread: creates the episode's sandbox (a failure ends the episode).
      act: `(episode) -> result`, worker thread: runs the pending tool call.
      observe: `(episode, result) -> None`, main thread: appends the tool call's observation, or ends the episode.
      collect: `(episode) -> None`, worker thread: reads the evidence of an ended episode and gives its sandbox
        back.
      done: `(episode) -> None`, main thread: an ended episode whose evidence is in (e.g. its trajectory is
        built and handed on for scoring while other episodes still run).
    """

    prepare: Callable[[list[Any]], Any]
    generate: Callable[[Any], Any]
    absorb: Callable[[Any, Any], None]
    open: Callable[[Any], None]
    act: Callable[[Any], Any]
    observe: Callable[[Any, Any], None]
    collect: Callable[[Any], None]
    done: Callable[[Any], None]


def run_lockstep(steps: EpisodeSteps, episodes: Sequence[Any], pool: concurrent.futures.Executor,
                 on_finished: Callable[[int], None]) -> None:
    """Turn by turn: one engine call over every live episode, then all their tool calls (module docstring).

    Args:
      steps: the agent loop's steps.
      episodes: the `_Episode`s of the call (some may already be ended, e.g. a prompt over the context limit).
      pool: thread pool for sandbox work.
      on_finished: called with the number of episodes that ended at each step (progress bar).
    Exceptions of a step propagate (the caller closes the sandboxes).
    """
    list(pool.map(steps.open, [ep for ep in episodes if ep.finish is None]))
    on_finished(sum(ep.finish is not None for ep in episodes))
    while live := [ep for ep in episodes if ep.finish is None]:
        job = steps.prepare(live)
        if job is not None:
            steps.absorb(job, steps.generate(job))
        acting = [ep for ep in live if ep.finish is None and ep.pending is not None]
        for ep, result in zip(acting, pool.map(steps.act, acting)):
            steps.observe(ep, result)
        on_finished(sum(ep.finish is not None for ep in live))
    list(pool.map(steps.collect, episodes))
    for ep in episodes:
        steps.done(ep)


def run_continuous(steps: EpisodeSteps, episodes: Sequence[Any], pool: concurrent.futures.Executor,
                   on_finished: Callable[[int], None], max_generate_batch: int,
                   max_concurrent_generate: int = 1) -> None:
    """Each episode on its own: ready episodes' generations, batched, while others' tool calls run.

    The module docstring describes the schedule.

    Every sandbox is opened first (a failure ends its episode), so the first engine call batches every episode.
    Then the main thread prepares a generation of up to `max_generate_batch` queued episodes whenever fewer than
    `max_concurrent_generate` engine calls are in flight, runs it in a generation thread, and meanwhile takes in
    finished sandbox steps (their episodes join the queue). With one call in flight (the default, an engine
    that runs one call at a time) the next call batches every episode that became ready during the current one.

    Args:
      steps, episodes, pool, on_finished: as in `run_lockstep` (`on_finished(1)` when an episode's evidence is in).
      max_generate_batch: most episodes per engine call (>= 1); queued episodes beyond it wait for the next call.
      max_concurrent_generate: engine calls in flight at once (>= 1).
    Raises: ValueError for a bound < 1 (naming it); exceptions of a step propagate.
    """
    for name, value in (("max_generate_batch", max_generate_batch), ("max_concurrent_generate",
                                                                     max_concurrent_generate)):
        if value < 1:
            raise ValueError(f"run_continuous: {name} must be >= 1, got {value}")
    ready: collections.deque = collections.deque()
    running: dict[concurrent.futures.Future, tuple[str, Any]] = {}
    generating = 0

    def route(ep) -> None:
        """After a main-thread step: collect an ended episode, run a pending tool call, or queue a generation."""
        if ep.finish is not None:
            running[pool.submit(steps.collect, ep)] = ("collect", ep)
        elif ep.pending is not None:
            running[pool.submit(steps.act, ep)] = ("act", ep)
        else:
            ready.append(ep)

    # all sandboxes first (as in lockstep): the first engine call then batches every episode instead of the few
    # whose sandbox opened first, and a one-call-at-a-time engine does not start out on fragments
    list(pool.map(steps.open, [ep for ep in episodes if ep.finish is None]))
    with concurrent.futures.ThreadPoolExecutor(max_concurrent_generate, thread_name_prefix="generate") as engine:
        for ep in episodes:
            route(ep)
        while ready or running:
            while ready and generating < max_concurrent_generate:
                batch = [ready.popleft() for _ in range(min(max_generate_batch, len(ready)))]
                job = steps.prepare(batch)
                if job is not None:
                    running[engine.submit(steps.generate, job)] = ("generate", job)
                    generating += 1
                for ep in batch:  # those that ended in `prepare` (out of budget)
                    if ep.finish is not None:
                        route(ep)
            if not running:
                continue
            completed, _ = concurrent.futures.wait(running, return_when=concurrent.futures.FIRST_COMPLETED)
            for future in [f for f in running if f in completed]:  # in submission order
                kind, item = running.pop(future)
                result = future.result()  # a step's unexpected exception propagates
                if kind == "generate":
                    generating -= 1
                    steps.absorb(item, result)
                    for ep in item.episodes:
                        route(ep)
                elif kind == "collect":
                    steps.done(item)
                    on_finished(1)
                else:  # a tool call returned
                    steps.observe(item, result)
                    route(item)
