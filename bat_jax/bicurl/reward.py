"""The reward of one GRPO rollout from a Stage Bank RL row (paper Eq. 4, released code's E2E rule).

This is the adapter from rollouts (`rollout.trajectory.Trajectory`) to the rubric verifier.

Details: docs/design.md.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import hashlib
import json
import threading
from collections.abc import Mapping, Sequence

from bat_jax.rollout.trajectory import Trajectory
from bat_jax.sandbox.readers import DecodeLimits
from bat_jax.sandbox.types import SandboxState
from bat_jax.stage_bank.row import RLRow
from bat_jax.staged_benchmark.contract import Reduction, StagedBenchmark, Task
from bat_jax.verify.judge import RubricJudge
from bat_jax.verify.rubric import REWARD_VERSION, Evidence, ScorerError


@dataclasses.dataclass(frozen=True)
class RolloutReward:
    """The reward of one rollout, with its contract version, focus, error and rubric item decisions.

    Fields: reward: 0–1 or None (unscored); version: the reward contract; focus: the row's stage or 'E2E'; error: why
    scoring failed when it did ('' otherwise): with reward None the failure was not the agent's (e.g. the row's task
    could not be rebuilt), with reward 0 scoring the agent's artefacts raised (its failure); items: the rubric
    verifier's item decisions of the verified stages (stage id → item id → passed; None when the rubric was not run:
    unscored, or a task-metric reward)."""

    reward: float | None
    version: str
    focus: str
    error: str = ""
    items: Mapping[str, Mapping[str, bool]] | None = None


@dataclasses.dataclass(frozen=True)
class RewardConfig:
    """How a GRPO batch is scored (gin: `grpo_round.GRPOBlockConfig.reward`).

    Attributes:
      max_workers: rollouts scored at once (threads; task metrics run in numpy, judge calls wait on the network).
      task_cache_size: rebuilt tasks kept per round (LRU entries; one entry holds a task's generated data, a few MB).
      decode: caps on decoding what the agent wrote (`sandbox.readers.DecodeLimits`).
    Raises:
      ValueError: a field < 1 (named).
    """

    max_workers: int = 4
    task_cache_size: int = 32
    decode: DecodeLimits = DecodeLimits()

    def __post_init__(self):
        for name in ("max_workers", "task_cache_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"RewardConfig.{name} must be >= 1, got {getattr(self, name)}")


def evidence_of(trajectory: Trajectory, start: SandboxState) -> Evidence:
    """Verifier evidence of one trajectory.

    Receipts, the final workspace (start files overlaid with the episode's changed files) and the submitted path; an
    infrastructure failure is carried as unscored."""
    files = {**dict(start.files), **dict(trajectory.artefacts)}
    for path in trajectory.skipped_artefacts:  # over a cap: absent, never the stale start version
        files.pop(path, None)
    return Evidence(tuple(trajectory.receipts), files, trajectory.submitted, infra_error=trajectory.infra_error,
                    agent_error=trajectory.agent_error, skipped=tuple(trajectory.skipped_artefacts),
                    start_files=dict(start.files))


def task_key(row: RLRow) -> str:
    """SHA-256 hex digest of what `row_task` rebuilds a row's task from.

    That is its track and the params of its `task_synthesis` and `e2e_reduce` provenance steps. Rows of one task (any
    stage, any outcome slice) share it."""
    steps = {t.name: dict(t.params) for t in row.provenance.transformations}
    text = json.dumps([row.provenance.track, steps.get("task_synthesis"), steps.get("e2e_reduce")],
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


class TaskCache:
    """Rebuilt tasks of `row_task` for `benchmark`, keyed by `task_key`.

    At most `maxsize` are kept (least recently used dropped). Thread-safe; concurrent requests for one key build it once
    (the others wait for it). `builds` counts the rebuilds. Raises ValueError for maxsize < 1."""

    def __init__(self, benchmark: StagedBenchmark, maxsize: int = 32):
        if maxsize < 1:
            raise ValueError(f"TaskCache: maxsize must be >= 1, got {maxsize}")
        self.benchmark = benchmark
        self.maxsize = maxsize
        self.builds = 0
        self._tasks: collections.OrderedDict[str, tuple] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._key_locks: dict[str, threading.Lock] = {}

    def get(self, row: RLRow) -> Task:
        """The task of `row`, as `row_task(row, benchmark)` returns it. Raises what `row_task` raises."""
        key = task_key(row)
        with self._lock:
            if key in self._tasks:
                self._tasks.move_to_end(key)
                return self._tasks[key]
            key_lock = self._key_locks.setdefault(key, threading.Lock())
        with key_lock:
            with self._lock:
                if key in self._tasks:
                    self._tasks.move_to_end(key)
                    return self._tasks[key]
            built = row_task(row, self.benchmark)
            with self._lock:
                self.builds += 1
                self._tasks[key] = built
                while len(self._tasks) > self.maxsize:
                    self._tasks.popitem(last=False)
                self._key_locks.pop(key, None)
            return built


def row_task(row: RLRow, benchmark: StagedBenchmark) -> Task:
    """The task a row was built from, hidden answer key included, rebuilt by `benchmark`.

    Raises:
      ValueError: the provenance lacks a `task_synthesis` step (names the row's state_id), or the benchmark
        cannot rebuild the task (e.g. a track it does not have).
    """
    steps = {t.name: dict(t.params) for t in row.provenance.transformations}
    if "task_synthesis" not in steps:
        raise ValueError(f"RL row {row.state_id}: provenance has no 'task_synthesis' step; cannot rebuild its "
                         f"rubric (steps: {sorted(steps)})")
    syn = steps["task_synthesis"]
    task = benchmark.training_task(row.provenance.track, int(syn["seed"]), str(syn["variant"]), int(syn["template"]))
    if "e2e_reduce" in steps:
        p = steps["e2e_reduce"]
        lam = Reduction(cases=int(p["cases"]), input_fraction=float(p["input_fraction"]),
                        validation_passes=int(p["validation_passes"]))
        task, _ = benchmark.reduce_task(task, lam, int(syn["template"]))
    return task


def rollout_reward(row: RLRow, trajectory: Trajectory, start: SandboxState, benchmark: StagedBenchmark,
                   judge: RubricJudge | None = None, tasks: TaskCache | None = None,
                   decode: DecodeLimits = DecodeLimits()) -> RolloutReward:
    """Scores one rollout of `row` that started from `start` (the row's state p) by `benchmark`'s rule.

    `judge` (optional) decides its configured rubric items; `tasks` (optional) supplies the rebuilt task (else it is
    rebuilt here); the agent's files are decoded within `decode`. Reward None = unscored (sandbox failure, or a judged
    item the judge could not decide). An exception while scoring the agent's artefacts (never expected: the readers are
    total) is the agent's failure: reward 0 with `RolloutReward.error` set.

    Raises:
      ScorerError: the reward is not a finite number in [0, 1] (an error of the scorer, never "unscored").
      whatever rebuilding the row's task raises (`row_task`).
    """
    version = judge.version if judge is not None else REWARD_VERSION
    evidence: Evidence = dataclasses.replace(evidence_of(trajectory, start), limits=decode)
    if row.reward_source == "task_metric":
        version = REWARD_VERSION + "+task"
    if evidence.infra_error:
        return RolloutReward(None, version, row.focus)
    task = tasks.get(row) if tasks is not None else row_task(row, benchmark)
    error, items = "", None
    try:  # reading and scoring what the agent wrote: whatever goes wrong here is the agent's failure
        if row.reward_source == "task_metric":
            reward = benchmark.task_metric(task, evidence.files, evidence.submitted, decode)
        else:
            episode = benchmark.score_episode(task, evidence, row.focus, judge)
            reward = episode.reward
            items = episode.item_decisions() if reward is not None else None
    except ScorerError:
        raise
    except Exception as exc:  # noqa: BLE001 - the readers are total; this is a last guard, scored 0
        reward, error = 0.0, f"scoring the rollout's artefacts raised: {type(exc).__name__}: {exc}"
    if reward is not None and not (isinstance(reward, (int, float)) and 0.0 <= reward <= 1.0):
        raise ScorerError(f"RL row {row.state_id} rollout {trajectory.episode}: reward {reward!r} is not a number "
                          "in [0, 1]")
    return RolloutReward(reward, version, row.focus, error, items)


def _contained(row: RLRow, trajectory: Trajectory, start: SandboxState, benchmark: StagedBenchmark,
               judge: RubricJudge | None, tasks: TaskCache | None, decode: DecodeLimits) -> RolloutReward:
    """`rollout_reward`, with an exception raised before the agent's artefacts are read made unscored.

    Such an exception (other than `ScorerError`) comes from rebuilding the row's task; the unscored reward names it."""
    try:
        return rollout_reward(row, trajectory, start, benchmark, judge, tasks, decode)
    except ScorerError:
        raise
    except Exception as exc:  # noqa: BLE001 - e.g. the row's task cannot be rebuilt: not the agent's doing
        version = judge.version if judge is not None else REWARD_VERSION
        return RolloutReward(None, version, row.focus, error=f"scoring failed: {type(exc).__name__}: {exc}")


class RolloutScorer:
    """Scores rollouts as they arrive, on at most `config.max_workers` threads.

    Reward scoring runs concurrently with generation: pass `submit` as the agent loop's `on_trajectory`. A context
    manager: leaving it waits for and shuts down the threads.

    Args:
      rows, starts: per position (the rollouts' order): the RL row and start state each rollout is scored against.
      benchmark, judge, config, tasks: as in `rollout_reward`; `tasks` default: a new
        `TaskCache(benchmark, config.task_cache_size)`.
    """

    def __init__(self, rows: Sequence[RLRow], starts: Sequence[SandboxState], benchmark: StagedBenchmark,
                 judge: RubricJudge | None = None, config: RewardConfig = RewardConfig(),
                 tasks: TaskCache | None = None):
        if len(rows) != len(starts):
            raise ValueError(f"RolloutScorer: {len(rows)} rows and {len(starts)} start states; expected one of each "
                             "per rollout")
        self.rows, self.starts, self.benchmark = rows, starts, benchmark
        self.judge, self.decode = judge, config.decode
        self.tasks = tasks if tasks is not None else TaskCache(benchmark, config.task_cache_size)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=config.max_workers,
                                                           thread_name_prefix="reward")
        self._futures: dict[int, concurrent.futures.Future] = {}

    def submit(self, position: int, trajectory: Trajectory) -> None:
        """Queues the rollout at `position` for scoring (returns at once).

        Raises ValueError for a position out of range or already submitted."""
        if not 0 <= position < len(self.rows) or position in self._futures:
            raise ValueError(f"RolloutScorer.submit: position {position} is out of range (0..{len(self.rows) - 1}) "
                             "or was submitted before")
        self._futures[position] = self._pool.submit(_contained, self.rows[position], trajectory,
                                                    self.starts[position], self.benchmark, self.judge, self.tasks,
                                                    self.decode)

    def results(self, positions: Sequence[int] | None = None) -> list[RolloutReward]:
        """Every position's reward (or those of `positions`), in position order; waits for them.

        `positions` is one process's share of a batch.

        A rollout whose scoring raised costs that rollout only, with `RolloutReward.error` set: reward 0 when
        reading the agent's artefacts raised (the agent's failure, as `rollout_reward` says), None (unscored) when
        something before them raised (rebuilding the row's task: not the agent's doing).

        Raises:
          ScorerError: a reward that is not a finite number in [0, 1] (a bug of the scorer).
          ValueError: a position was never submitted.
        """
        wanted = range(len(self.rows)) if positions is None else positions
        missing = [i for i in wanted if i not in self._futures]
        if missing:
            raise ValueError(f"RolloutScorer.results: positions {missing[:8]} were never submitted")
        return [self._futures[i].result() for i in wanted]

    def __enter__(self) -> "RolloutScorer":
        return self

    def __exit__(self, *exc) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def score_rollouts(rows: Sequence[RLRow], trajectories: Sequence[Trajectory], starts: Sequence[SandboxState],
                   benchmark: StagedBenchmark, judge: RubricJudge | None = None,
                   config: RewardConfig = RewardConfig(), tasks: TaskCache | None = None) -> list[RolloutReward]:
    """`rollout_reward` for every rollout, on at most `config.max_workers` threads, in the same order.

    It calls `rollout_reward(rows[i], trajectories[i], starts[i], benchmark, judge, tasks)` for every i on a
    `RolloutScorer`. `tasks` default: a new `TaskCache` of `config.task_cache_size` for this call. Raises ValueError
    when the three sequences differ in length, and what `rollout_reward` raises."""
    if not len(rows) == len(trajectories) == len(starts):
        raise ValueError(f"score_rollouts: {len(rows)} rows, {len(trajectories)} trajectories and {len(starts)} "
                         "start states; expected one of each per rollout")
    with RolloutScorer(rows, starts, benchmark, judge, config, tasks) as scorer:
        for i, trajectory in enumerate(trajectories):
            scorer.submit(i, trajectory)
        return scorer.results()
