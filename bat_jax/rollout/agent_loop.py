"""Multi-turn agent rollouts: a policy engine talking to sandboxes through the two tools (paper App. A.2).

Details: docs/design.md.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from bat_jax.models.chat import ParseError, parse_tool_call, tool_schemas
from bat_jax.rollout import trajectory as tj
from bat_jax.rollout.engine import RolloutEngine, SamplingParams
from bat_jax.rollout.sampling import SamplingConfig
from bat_jax.rollout.schedule import EPISODE_SCHEDULES, EpisodeSteps, run_continuous, run_lockstep
from bat_jax.sandbox.evidence import EvidenceLimits
from bat_jax.sandbox.types import FileTooLarge, Sandbox, SandboxState, fault_of, sha256_hex


@dataclasses.dataclass(frozen=True)
class AgentLoopConfig:
    """Rollout limits and sampling (units: tokens, characters, seconds).

    Attributes:
      sampling: K episodes per request (`group_size`) and the transform every turn is sampled with
        (`rollout/sampling.SamplingConfig`; a run fills it from `experiment.Components.sampling`, the one binding).
      max_assistant_turns: assistant turns per episode (released code: 24).
      max_tool_calls: tool calls per episode (released code: 23).
      max_response_tokens: sampled tokens over the whole episode (released code: 16,384).
      max_tokens_per_turn: sampled tokens per assistant turn (paper response limit: 2,048).
      max_context_tokens: prompt + everything appended (paper context: 12,288).
      max_observation_chars: characters of one observation shown to the agent (released code: 2,048).
      tool_timeout_s: hard limit of one execute_code call (released code: 120 s).
      max_workers: threads for sandbox creation, tool calls and evidence (0, the default: one per episode of a
        call, so no episode's sandbox work queues behind another's — the calls wait on Docker / subprocesses,
        not on this process's CPU); `workers(episodes)` gives the number a call uses.
      end_on_no_tool_call: end an episode at a turn without any tool call (else it is an observation).
      max_artefact_bytes: total bytes of changed workspace files kept in `Trajectory.artefacts`.
      evidence: caps on reading the workspace back (files listed, bytes per file, seconds in all).
      progress: show a tqdm progress bar over finished episodes.
      schedule: 'continuous' (default) or 'lockstep' (`bat_jax.rollout.schedule`); same trajectories.
      max_generate_batch: most episodes per engine call under the 'continuous' schedule (episodes; 'lockstep'
        sends every live episode in one call). The engine may split a call further (e.g.
        `JaxSampler.max_batch`).
      max_concurrent_generate: engine calls in flight at once under 'continuous' (1: one call at a time, for
        an engine that runs one call per device, e.g. the embedded JAX sampler; more for a server that batches
        concurrent requests in flight, e.g. vLLM or `SimulatedLatency(inflight=True)`).
      stage_turn_slack: None (default): a request's turns are capped by `max_assistant_turns` alone. n >= 0: a
        request that names its teacher's turns (`RolloutRequest.teacher_turns`: a stage row's) ends after those + n
        turns, so its stage reward credits the stage's work done as the teacher did it, not after other stages'
        actions (the stage prompt asks for "the work of <stage> only, then stop"; docs/measurements.md).
    Raises:
      ValueError: naming the field, for a limit below its minimum or an unknown schedule.
    """

    sampling: SamplingConfig = SamplingConfig()
    max_assistant_turns: int = 24
    max_tool_calls: int = 23
    max_response_tokens: int = 16384
    max_tokens_per_turn: int = 2048
    max_context_tokens: int = 12288
    max_observation_chars: int = 2048
    tool_timeout_s: float = 120.0
    max_workers: int = 0
    end_on_no_tool_call: bool = False
    max_artefact_bytes: int = 8 << 20
    evidence: EvidenceLimits = EvidenceLimits()
    progress: bool = True
    schedule: str = "continuous"
    max_generate_batch: int = 64
    max_concurrent_generate: int = 1
    stage_turn_slack: int | None = None

    def __post_init__(self):
        if self.schedule not in EPISODE_SCHEDULES:
            raise ValueError(f"AgentLoopConfig.schedule must be one of {EPISODE_SCHEDULES}, got {self.schedule!r}")
        for name in ("max_assistant_turns", "max_response_tokens", "max_tokens_per_turn",
                     "max_context_tokens", "max_observation_chars", "max_generate_batch",
                     "max_concurrent_generate"):
            if getattr(self, name) < 1:
                raise ValueError(f"AgentLoopConfig.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("max_tool_calls", "max_workers", "stage_turn_slack"):
            if (getattr(self, name) or 0) < 0:
                raise ValueError(f"AgentLoopConfig.{name} must be >= 0, got {getattr(self, name)}")

    def workers(self, episodes: int) -> int:
        """Threads a call over `episodes` episodes uses for sandbox work: `max_workers`, or one per episode (>= 1)."""
        return self.max_workers or max(1, int(episodes))

    def max_turns(self, teacher_turns: int | None) -> int:
        """Assistant turns of a request whose teacher took `teacher_turns` (None: not a stage row's)."""
        if teacher_turns is None or self.stage_turn_slack is None:
            return self.max_assistant_turns
        return min(self.max_assistant_turns, teacher_turns + self.stage_turn_slack)


@dataclasses.dataclass(frozen=True)
class RolloutRequest:
    """What the agent loop needs from one RL row.

    Attributes:
      state_id: the row's state_id.
      state: the executable sandbox state p each episode starts from.
      system_prompt: the agent's system text; the tool schemas are added by the chat template (`tools`).
      user_message: the first user turn (the task brief and the stage skill κ).
      tools: tool schemas for the template's tools block (default: execute_code and submit).
      stage: stage name, recorded in the trajectories.
      teacher_turns: the turns the teacher took from this state (a stage row's own episode), None when unknown or
        not capped (`AgentLoopConfig.stage_turn_slack`).
    """

    state_id: str
    state: SandboxState
    system_prompt: str
    user_message: str
    tools: tuple[Mapping[str, Any], ...] = tuple(tool_schemas())
    stage: str = ""
    teacher_turns: int | None = None


def cut_observation(text: str, max_chars: int) -> str:
    """`text` cut to `max_chars` characters plus a marker saying how many were dropped."""
    if len(text) <= max_chars:
        return text
    return text[:max_chars] + f"\n...[observation truncated: {len(text) - max_chars} more chars]"


class _Episode:
    """Mutable bookkeeping of one live episode (main thread only, except `sandbox` calls)."""

    def __init__(self, position: int, request: RolloutRequest, k: int, builder: Any, seed: int):
        self.position, self.request, self.k, self.builder, self.seed = position, request, k, builder, seed
        self.trajectory: tj.Trajectory | None = None  # once done
        self.sandbox: Sandbox | None = None
        self.ids: list[int] = []
        self.prompt_len = 0
        self.turns = self.tool_calls = self.response_tokens = self.sandbox_errors = 0
        self.truncated = False
        self.finish: str | None = None
        self.infra_error = ""
        self.agent_error = ""
        self.weight_version = 0
        self.turn_versions: list[int] = []  # the weight version of each sampled turn
        self.pending: Any = None  # Action to run, or None
        self.evidence: tuple = ((), None, {}, [])  # (receipts, submitted, artefacts, skipped), once collected
        self.kept: tuple | None = None  # (episode, messages) before an observation that did not fit the context


@dataclasses.dataclass
class _TurnJob:
    """One engine call's worth of turns: the episodes, their prompts (token ids), budgets and seeds."""

    episodes: list[_Episode]
    prompts: list[list[int]]
    budgets: list[int]
    seeds: list[int]


class AgentLoop:
    """Runs K multi-turn episodes per `RolloutRequest`, batching model calls across episodes.

    Args:
      engine: the policy (`RolloutEngine`).
      builder_factory: returns a fresh `EpisodeBuilder` (`bat_jax.models.episode`) per episode; its `family`
        picks the tool-call parser and its `eot_id` the stop token.
      sandbox_factory: `state -> Sandbox`, a fresh sandbox restored from `state` (Docker pool in training,
        `LocalSandbox` in tests).
      config: limits and sampling.
      sandbox_release: gives a finished episode's sandbox back (default: `sandbox.close()`); with a warm
        `bat_jax.sandbox.pool.SandboxPool` pass `pool.release` and `lambda s: pool.acquire(s, timeout_s)` as the
        factory. Every episode of a `run` opens its sandbox at the start and holds it until it ends (under
        'lockstep': until the batch ends), so the pool needs at least (rows x K) sandboxes, or a finite acquire
        timeout (a timeout makes the rollout unscored).
      extra_stop_ids: further stop ids (e.g. `<|endoftext|>`, `<|im_start|>`); a turn ending in one is
        appended as a truncated turn (end-of-turn added as glue); `<|im_start|>` itself is dropped because the
        template cannot hold it inside an assistant turn.
    """

    def __init__(self, engine: RolloutEngine, builder_factory: Callable[[], Any],
                 sandbox_factory: Callable[[SandboxState], Sandbox], config: AgentLoopConfig = AgentLoopConfig(),
                 *, sandbox_release: Callable[[Sandbox], None] | None = None, extra_stop_ids: Sequence[int] = ()):
        self.engine, self.builder_factory, self.sandbox_factory = engine, builder_factory, sandbox_factory
        self.sandbox_release = sandbox_release
        self.config = config
        self.extra_stop_ids = tuple(int(i) for i in extra_stop_ids)

    def run(self, requests: Sequence[RolloutRequest], *, seed: int = 42,
            on_trajectory: Callable[[int, tj.Trajectory], None] | None = None) -> list[tj.Trajectory]:
        """Rolls out K (`config.sampling.group_size`) episodes per request.

        Args:
          requests: the batch's RL rows.
          seed: the round's seed; episode (i, k) turn t samples with a seed derived from (seed, i, k, t).
          on_trajectory: `(position, trajectory) -> None`, called in the calling thread as soon as an episode's
            evidence is in (position = i * K + k, its index in the returned list), while other episodes may still
            run — e.g. to score it concurrently with generation (`bicurl.reward.RolloutScorer`). Under
            'lockstep' every call comes at the end. An exception from it propagates (sandboxes are released).
        Returns: trajectories ordered by request, then k.
        """
        return self.run_episodes([(req, i, k) for i, req in enumerate(requests)
                                  for k in range(self.config.sampling.group_size)], seed=seed,
                                 on_trajectory=on_trajectory)

    def run_episodes(self, episodes: Sequence[tuple[RolloutRequest, int, int]], *, seed: int = 42,
                     on_trajectory: Callable[[int, tj.Trajectory], None] | None = None) -> list[tj.Trajectory]:
        """Rolls out the given episodes of a round's batch.

        `(request, i, k)` is episode k of the request at index i of the round's batch, sampled with the same seeds as in
        `run(requests, seed=seed)` (so a subset of a batch's episodes, e.g. one rollout worker's share, gives those
        episodes' trajectories). Returns them in the given order; `on_trajectory` as in `run`, with positions into
        `episodes`."""
        cfg = self.config
        episodes = [_Episode(position, req, k, self.builder_factory(),
                             int(np.random.SeedSequence([seed, i, k]).generate_state(1)[0]))
                    for position, (req, i, k) in enumerate(episodes)]
        if not episodes:
            return []
        first = episodes[0].builder
        im_start = getattr(first, "im_start_id", None)
        stops = (first.eot_id,) + tuple(s for s in self.extra_stop_ids if s != first.eot_id)
        params = cfg.sampling.params(cfg.max_tokens_per_turn, stops)
        for ep in episodes:  # tokenizers are not shared across threads: prompts are rendered here
            self._start(ep)
        bar = tqdm(total=len(episodes), desc="rollouts", unit="ep", disable=not cfg.progress, leave=False)
        steps = EpisodeSteps(prepare=self._prepare_turn, generate=lambda job: self._generate(job, params),
                             absorb=lambda job, out: self._absorb_turn(job, out, im_start),
                             open=self._open_sandbox, act=self._act, observe=self._observe, collect=self._collect,
                             done=lambda ep: self._done(ep, on_trajectory))
        with concurrent.futures.ThreadPoolExecutor(max_workers=cfg.workers(len(episodes))) as pool:
            try:
                if cfg.schedule == "lockstep":
                    run_lockstep(steps, episodes, pool, bar.update)
                else:
                    run_continuous(steps, episodes, pool, bar.update, cfg.max_generate_batch,
                                   cfg.max_concurrent_generate)
                return [ep.trajectory for ep in episodes]
            finally:
                bar.close()
                for ep in episodes:  # after an error: release whatever is still open (close is idempotent)
                    self._close(ep)

    def _close(self, ep: _Episode) -> None:
        sandbox, ep.sandbox = ep.sandbox, None
        if sandbox is not None:
            try:
                (self.sandbox_release or type(sandbox).close)(sandbox)
            except Exception:  # noqa: BLE001 - a failed release must not hide the rollout's result or error
                pass

    # -- steps -------------------------------------------------------------------------------------------------

    def _start(self, ep: _Episode) -> None:
        req = ep.request
        messages = [{"role": "system", "content": req.system_prompt}, {"role": "user", "content": req.user_message}]
        ep.ids = list(ep.builder.start(messages, [dict(t) for t in req.tools]))
        ep.prompt_len = len(ep.ids)
        if len(ep.ids) >= self.config.max_context_tokens:
            ep.finish = tj.FINISH_MAX_CONTEXT

    def _open_sandbox(self, ep: _Episode) -> None:
        """Creates the episode's sandbox from the row's state (worker thread)."""
        try:
            ep.sandbox = self.sandbox_factory(ep.request.state)
        except Exception as exc:  # noqa: BLE001 - any backend failure makes the rollout unscored
            ep.infra_error = f"sandbox creation failed: {type(exc).__name__}: {exc}"
            ep.finish = tj.FINISH_SANDBOX_ERROR

    def _prepare_turn(self, batch: list[_Episode]) -> _TurnJob | None:
        """The engine request for the next turn of `batch` (main thread).

        Episodes out of response tokens or context end here. Returns None when none of them asks for a turn."""
        cfg = self.config
        asking, budgets = [], []
        for ep in batch:
            left = cfg.max_response_tokens - ep.response_tokens
            room = cfg.max_context_tokens - len(ep.ids)
            if left < 1 or room < 1:
                ep.finish = tj.FINISH_MAX_RESPONSE_TOKENS if left < 1 else tj.FINISH_MAX_CONTEXT
                continue
            asking.append(ep)
            budgets.append(min(cfg.max_tokens_per_turn, left, room))
        if not asking:
            return None
        seeds = [int(np.random.SeedSequence([ep.seed, ep.turns]).generate_state(1)[0]) for ep in asking]
        return _TurnJob(asking, [list(ep.ids) for ep in asking], budgets, seeds)

    def _generate(self, job: _TurnJob, params: SamplingParams) -> list | Exception:
        """One engine call for a prepared turn (any thread).

        Returns the engine's completions, or the exception the call raised (it ends the job's episodes in
        `_absorb_turn`, never the batch)."""
        try:
            completions = self.engine.generate(job.prompts, params, max_new_tokens=job.budgets, seeds=job.seeds)
        except Exception as exc:  # noqa: BLE001 - the engine's failure, not the agent's
            return exc
        if len(completions) != len(job.episodes):
            return RuntimeError(f"the engine returned {len(completions)} completions for {len(job.episodes)} prompts")
        return completions

    def _absorb_turn(self, job: _TurnJob, completions: list | Exception, im_start: int | None) -> None:
        """Appends the sampled turns and parses their tool calls (main thread).

        A failed engine call ends its episodes unscored (`FINISH_ENGINE_ERROR`); a turn that cannot be processed ends
        its own episode, scored as the agent's failure (`FINISH_INVALID_TURN`); other episodes go on."""
        if isinstance(completions, Exception):
            for ep in job.episodes:
                ep.finish = tj.FINISH_ENGINE_ERROR
                ep.infra_error = f"generation failed: {type(completions).__name__}: {completions}"
            return
        for ep, budget, comp in zip(job.episodes, job.budgets, completions):
            try:
                self._absorb_one(ep, budget, comp, im_start)
            except Exception as exc:  # noqa: BLE001 - the model's output broke the turn: this episode ends
                ep.pending = None
                ep.finish = tj.FINISH_INVALID_TURN
                ep.agent_error = ep.agent_error or f"the turn could not be processed: {type(exc).__name__}: {exc}"

    def _absorb_one(self, ep: _Episode, budget: int, comp: Any, im_start: int | None) -> None:
        """Appends one episode's sampled turn and parses its tool call (main thread)."""
        cfg = self.config
        ids = [int(t) for t in comp.token_ids]
        logprobs = [float(x) for x in comp.logprobs]
        overshot = len(ids) > budget  # an engine that ignored the budget: cut ids and logprobs together
        ids, logprobs = ids[:budget], logprobs[:budget]
        ended = bool(ids) and ids[-1] == ep.builder.eot_id and not overshot
        if im_start is not None and ids and ids[-1] == im_start:
            ids, logprobs = ids[:-1], logprobs[:-1]
        ep.weight_version = comp.weight_version
        ep.turn_versions.append(int(comp.weight_version))
        ep.turns += 1
        if not ids:
            ep.finish = tj.FINISH_INVALID_TURN
            return
        cut = not ended and len(ids) == budget  # stopped by a token limit, not by a stop token
        ep.truncated = ep.truncated or cut
        ep.builder.add_assistant(ids, logprobs, truncated=not ended)
        ep.response_tokens += len(ids)
        self._after_turn(ep, ids, cut and ep.response_tokens >= cfg.max_response_tokens)

    def _after_turn(self, ep: _Episode, ids: list[int], out_of_budget: bool) -> None:
        cfg = self.config
        ep.pending = None
        if out_of_budget:
            ep.finish = tj.FINISH_MAX_RESPONSE_TOKENS
            return
        codec = getattr(ep.builder, "codec", None)  # control tokens marked: the parse is unambiguous
        action = parse_tool_call(codec.decode(ids) if codec is not None else ep.builder.tokenizer.decode(ids),
                                 ep.builder.family)
        if isinstance(action, ParseError):
            if action.kind == "no_tool_call" and cfg.end_on_no_tool_call:
                ep.finish = tj.FINISH_NO_TOOL_CALL
            elif ep.turns >= cfg.max_turns(ep.request.teacher_turns):
                ep.finish = tj.FINISH_MAX_TURNS
            else:
                self._append_observation(ep, action.observation)
            return
        if ep.tool_calls >= cfg.max_tool_calls:
            ep.finish = tj.FINISH_MAX_TOOL_CALLS
            return
        ep.pending = action

    def _act(self, ep: _Episode) -> tuple[str, bool]:
        """Runs the pending tool call in the episode's sandbox (worker thread).

        Returns (observation text, whether a submit succeeded); a backend exception becomes an observation."""
        action = ep.pending
        try:
            if action.tool == "submit":
                obs = ep.sandbox.submit(action.arguments["path"])
                return obs.render(), obs.exit_code == 0 and ep.sandbox.submitted() is not None
            obs = ep.sandbox.execute_code(action.arguments["language"], action.arguments["code"],
                                          timeout_s=self.config.tool_timeout_s)
            return obs.render(), False
        except Exception as exc:  # noqa: BLE001 - shown to the agent, counted on the trajectory
            ep.sandbox_errors += 1
            return f"[sandbox error] {type(exc).__name__}: {exc}", False

    def _observe(self, ep: _Episode, result: tuple[str, bool]) -> None:
        observation, submitted = result
        ep.pending = None
        ep.tool_calls += 1
        if submitted:
            ep.finish = tj.FINISH_SUBMITTED
        elif ep.turns >= self.config.max_turns(ep.request.teacher_turns):
            ep.finish = tj.FINISH_MAX_TURNS
        else:
            try:
                self._append_observation(ep, observation)
            except Exception as exc:  # noqa: BLE001 - the agent's own output could not be appended
                ep.finish = tj.FINISH_INVALID_TURN
                ep.agent_error = ep.agent_error or f"the observation could not be appended: {type(exc).__name__}: {exc}"

    def _append_observation(self, ep: _Episode, text: str) -> None:
        """Appends the observation (cut to `max_observation_chars`) and the next generation prompt.

        An observation whose tokens would take the episode past `max_context_tokens` ends it (`FINISH_MAX_CONTEXT`,
        scored: the agent's output outgrew its context) with the trajectory as it was before: no trajectory is ever
        longer than the context the learner is compiled for, however many tokens the agent's output encodes to."""
        before = (ep.builder.build(), ep.builder.messages())
        ep.builder.add_tool_response(cut_observation(text, self.config.max_observation_chars))
        ep.ids = ep.builder.build().ids.tolist()  # the next prompt: everything so far, ending in the generation prompt
        if len(ep.ids) > self.config.max_context_tokens:
            ep.kept, ep.ids = before, before[0].ids.tolist()
            ep.finish = tj.FINISH_MAX_CONTEXT
        elif len(ep.ids) >= self.config.max_context_tokens:
            ep.finish = tj.FINISH_MAX_CONTEXT

    def _collect(self, ep: _Episode) -> None:
        """Evidence of an ended episode into `ep.evidence`, then its sandbox given back (worker thread)."""
        ep.evidence = self._evidence(ep)
        self._close(ep)

    def _done(self, ep: _Episode, on_trajectory: Callable[[int, tj.Trajectory], None] | None) -> None:
        """The ended episode's trajectory (main thread: the builder's tokenizer), handed to `on_trajectory`.

        A trajectory that cannot be built is replaced by an empty one that is unscored (`infra_error`)."""
        try:
            ep.trajectory = self._finish(ep, *ep.evidence)
        except Exception as exc:  # noqa: BLE001 - one episode's failure never ends the batch
            ep.infra_error = ep.infra_error or f"building the trajectory failed: {type(exc).__name__}: {exc}"
            empty = np.zeros(0, np.int32)
            ep.trajectory = tj.Trajectory(
                state_id=ep.request.state_id, episode=ep.k, stage=ep.request.stage, ids=empty, loss_mask=empty,
                logprobs=np.zeros(0, np.float32), prompt_len=0, finish_reason=tj.FINISH_SANDBOX_ERROR,
                truncated=ep.truncated, num_turns=ep.turns, num_tool_calls=ep.tool_calls, response_tokens=0,
                infra_error=ep.infra_error, agent_error=ep.agent_error, sandbox_errors=ep.sandbox_errors)
        if on_trajectory is not None:
            on_trajectory(ep.position, ep.trajectory)

    def _evidence(self, ep: _Episode) -> tuple:
        """Receipts, submitted path and artefacts from the episode's sandbox (worker thread).

        A sandbox the agent brought down, or a workspace that cannot be read back (what the agent wrote: names, sizes),
        gives its receipts and no artefacts (scored, the agent's failure); a sandbox failure the agent cannot cause
        (`fault == 'infra'`), nothing (unscored)."""
        if ep.sandbox is None:
            return (), None, {}, []
        if self._agent_fault(ep):
            return tuple(ep.sandbox.receipts()), ep.sandbox.submitted(), {}, []
        try:
            artefacts, skipped = self._artefacts(ep)
            return tuple(ep.sandbox.receipts()), ep.sandbox.submitted(), artefacts, skipped
        except Exception as exc:  # noqa: BLE001 - evidence lost
            if self._agent_fault(ep):
                return tuple(ep.sandbox.receipts()), ep.sandbox.submitted(), {}, []
            text = f"collecting evidence failed: {type(exc).__name__}: {exc}"
            if fault_of(ep.sandbox)[0] == "infra":
                ep.infra_error = ep.infra_error or text
                return (), None, {}, []
            ep.agent_error = ep.agent_error or text
            return tuple(ep.sandbox.receipts()), ep.sandbox.submitted(), {}, []

    @staticmethod
    def _agent_fault(ep: _Episode) -> bool:
        """True (and `ep.agent_error` set) when the sandbox failed after the agent's code ran.

        That is when the sandbox died, hung or stopped answering after the agent's code ran (`fault_of(sandbox)` is
        'agent')."""
        fault, text = fault_of(ep.sandbox)
        if fault != "agent":
            return False
        ep.agent_error = ep.agent_error or text or "sandbox died after agent code"
        return True

    def _finish(self, ep: _Episode, receipts, submitted, artefacts, skipped) -> tj.Trajectory:
        """The ended episode's trajectory, never longer than `max_context_tokens`.

        Trailing mask-0 glue past it (an end-of-turn appended to a turn the limit cut, the template's closing newline; a
        prompt longer than the context) is dropped.

        Raises:
          RuntimeError: a sampled token past the limit (a broken engine budget; the trajectory is then unscored).
        """
        episode, messages = ep.kept if ep.kept is not None else (ep.builder.build(), ep.builder.messages())
        ids, mask, logprobs = episode.ids, episode.loss_mask, episode.logprobs
        limit = self.config.max_context_tokens
        if len(ids) > limit:
            if np.any(np.asarray(mask[limit:]) != 0):
                raise RuntimeError(f"episode {ep.k} of {ep.request.state_id} has sampled tokens past "
                                   f"max_context_tokens={limit} ({len(ids)} tokens)")
            ids, mask, logprobs = ids[:limit], mask[:limit], logprobs[:limit]
        template = episode.template.to_dict() if hasattr(episode.template, "to_dict") else {}
        return tj.Trajectory(
            state_id=ep.request.state_id, episode=ep.k, stage=ep.request.stage, ids=ids,
            loss_mask=mask, logprobs=logprobs, prompt_len=min(ep.prompt_len, limit),
            finish_reason=ep.finish, truncated=ep.truncated, num_turns=ep.turns, num_tool_calls=ep.tool_calls,
            response_tokens=int(np.sum(mask)), receipts=receipts, artefacts=artefacts,
            skipped_artefacts=tuple(skipped), submitted=submitted, messages=tuple(messages),
            infra_error=ep.infra_error, agent_error=ep.agent_error, sandbox_errors=ep.sandbox_errors,
            weight_version=ep.weight_version, turn_versions=tuple(ep.turn_versions),
            template=template)

    def _artefacts(self, ep: _Episode) -> tuple[dict[str, bytes], list[str]]:
        """Changed workspace files within `max_artefact_bytes` and `config.evidence`; the rest are skipped."""
        lim = self.config.evidence
        initial = ep.request.state.files
        kept, skipped, total = {}, [], 0
        deadline = time.monotonic() + lim.max_seconds
        paths = ep.sandbox.list_files()
        for n, path in enumerate(paths):
            if n >= lim.max_files or time.monotonic() > deadline:
                skipped.extend(paths[n:])
                break
            budget = min(lim.max_file_bytes, self.config.max_artefact_bytes - total)
            if path in initial:  # read enough to tell an unchanged start file
                budget = max(budget, min(len(initial[path]), lim.max_file_bytes))
            try:
                data = ep.sandbox.read_file(path, max_bytes=budget)
            except FileTooLarge:
                skipped.append(path)
                continue
            except FileNotFoundError:
                continue
            except (OSError, ValueError):  # unreadable (permissions, an odd name): the agent's failure
                skipped.append(path)
                continue
            if path in initial and sha256_hex(data) == sha256_hex(bytes(initial[path])):
                continue
            if total + len(data) > self.config.max_artefact_bytes:
                skipped.append(path)
                continue
            kept[path] = data
            total += len(data)
        return kept, skipped

