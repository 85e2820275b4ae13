"""The held-out evaluator V(π) = (Overall M, stage scores e) (paper Eq. 1, Section 3), and an external adapter.

The evaluator plays the agent (a policy with the fixed stage skills and the two tools) on the bundled held-out
suite — 7 tracks × R repeats — scores every cell with the rubric verifier and the task metric, and returns
**only aggregates** (`Summary`: two-level means, half-widths, per-track means). Cells, transcripts, task ids,
paths and answers never leave this module: this is the evaluation side of the firewall. A cell is played by a
`CellRunner`: `EngineCells` for the token-level policy (one episode through the agent loop GRPO rollouts use) or
`PolicyCells` for action-level policies (scripted experts, teachers, baselines; `rollout.play`); both score it
with `tasks.episode.score_episode`.

The controller's evaluation and the final evaluation use disjoint runs: `EvalConfig.purpose` selects a
disjoint slice of the held-out suite seeds and of the policy seeds (paper: "The controller evaluation and
final evaluation use disjoint runs").

The bundled suite is this project's own fictional suite, not AutoMedBench-Lite. `ExternalEvaluator` runs any
command (an argv template with `{checkpoint}` and `{output}`) and reads per-cell scores back, for users who
have AutoMedBench-Lite or another staged benchmark.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import pathlib
import subprocess
from collections.abc import Callable, Sequence
from typing import Protocol

from tqdm.auto import tqdm

from bat_jax.benchmark.scoring import NOT_APPLICABLE, Cell, Summary, aggregate
from bat_jax.benchmark.stages import E2E, STAGES, Stage
from bat_jax.bicurl.reward import evidence_of
from bat_jax.prompts import request
from bat_jax.rollout.agent_loop import AgentLoop
from bat_jax.rollout.play import play
from bat_jax.sandbox.backends import SandboxFactory
from bat_jax.stage_bank.slicing import row_skill
from bat_jax.tasks.base import TaskInstance
from bat_jax.tasks.episode import ActionPolicy, score_episode
from bat_jax.tasks.heldout import heldout_suite, write_manifest
from bat_jax.tasks.registry import TRACKS
from bat_jax.verify.judge import RubricJudge

#: Suite seed offset per evaluation purpose (disjoint held-out tasks and policy seeds).
PURPOSES = {"controller": 0, "final": 1}


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """Held-out evaluation settings.

    Attributes:
      repeats: R repeats per track (paper: 10; the tiny default uses fewer).
      variants: outcome variants of the held-out tasks cycled over repeats.
      purpose: 'controller' (routing / acceptance each round) or 'final' (the reported numbers); the two use
        disjoint held-out tasks and policy seeds.
      tracks: track names, None = all seven.
      max_turns: assistant turns per episode.
      max_workers: episodes played concurrently (threads; sandbox calls release the GIL).
      seed: base seed of the policy's sampling.
    """

    repeats: int = 10
    variants: tuple[str, ...] = ("success", "recovery")
    purpose: str = "controller"
    tracks: tuple[str, ...] | None = None
    max_turns: int = 24
    max_workers: int = 4
    seed: int = 0

    def __post_init__(self):
        if self.purpose not in PURPOSES:
            raise ValueError(f"EvalConfig.purpose must be one of {sorted(PURPOSES)}, got {self.purpose!r}")
        if self.repeats < 1:
            raise ValueError(f"EvalConfig.repeats must be >= 1, got {self.repeats}")


@dataclasses.dataclass(frozen=True)
class EvalJob:
    """One cell to play: a held-out task, its repeat index and the policy seed for this repeat."""

    track: str
    repeat: int
    task: TaskInstance
    seed: int


class CellRunner(Protocol):
    """Plays and scores a batch of cells (an agent: policy + stage skills + tools + sandbox backend).

    A runner may also keep `agent_failed: int`, set by each call: how many of its cells were agent-caused
    sandbox failures (the agent's code killed or hung the sandbox) that were still scored (`Cell.scored`) —
    counted for the ledger beside the unscored (infrastructure) cells; `PolicyCells` and `EngineCells` do.
    It never changes a score.
    """

    def __call__(self, jobs: Sequence[EvalJob]) -> list[Cell]:
        """Returns one Cell per job, in order; an infrastructure failure gives an unscored cell."""


def suite_jobs(config: EvalConfig) -> list[EvalJob]:
    """The cells of one evaluation: for each track, R repeats over the held-out tasks of `config.purpose`."""
    per_variant = -(-config.repeats // len(config.variants))  # ceil
    suite = heldout_suite(n_per_track=per_variant, variants=config.variants,
                          suite_seed=PURPOSES[config.purpose], tracks=config.tracks)
    by_track: dict[str, list[TaskInstance]] = {}
    for inst in suite:
        by_track.setdefault(inst.track, []).append(inst)
    jobs = []
    seed_base = config.seed + 1_000_003 * PURPOSES[config.purpose]
    for track, insts in by_track.items():
        # interleave variants so that the first R tasks cover them evenly
        ordered = [insts[v * per_variant + k] for k in range(per_variant) for v in range(len(config.variants))]
        for repeat in range(config.repeats):
            jobs.append(EvalJob(track, repeat, ordered[repeat % len(ordered)], seed_base + repeat))
    return jobs


def write_heldout_manifest(path: pathlib.Path, config: EvalConfig) -> pathlib.Path:
    """Writes the held-out manifest (`tasks.heldout.write_manifest`) of the tasks both purposes of `config` play —
    what the Stage Bank's leakage preflight guards against — to `path`; returns `path`."""
    tasks = [job.task for purpose in PURPOSES for job in suite_jobs(dataclasses.replace(config, purpose=purpose))]
    write_manifest(path, tasks)
    return pathlib.Path(path)


def evaluate(run_cells: CellRunner, config: EvalConfig) -> Summary:
    """Plays the held-out suite and returns only its aggregate (two-level means, half-widths)."""
    jobs = suite_jobs(config)
    cells = run_cells(jobs)
    if len(cells) != len(jobs):
        raise RuntimeError(f"cell runner returned {len(cells)} cells for {len(jobs)} jobs")
    return aggregate(cells)


@dataclasses.dataclass
class PolicyCells:
    """A CellRunner for action-level policies (scripted expert, OpenAI-compatible teacher, baselines).

    Attributes:
      policy_factory: seed → `tasks.episode.ActionPolicy` (a callable Conversation → Action | None).
      make_sandbox: SandboxState → Sandbox (Docker in real runs; see `sandbox.backends.backend_factory`).
      max_turns: assistant turns per episode.
      max_workers: episodes in flight at once.
      progress: tqdm progress bar.
      agent_failed: after each call, its scored cells whose sandbox the agent's code brought down
        (`verify.rubric.Evidence.agent_error`).
    """

    policy_factory: Callable[[int], ActionPolicy]
    make_sandbox: SandboxFactory
    max_turns: int = 24
    max_workers: int = 4
    progress: bool = True
    agent_failed: int = 0

    def __call__(self, jobs: Sequence[EvalJob]) -> list[Cell]:
        def one(job: EvalJob) -> tuple[Cell, bool]:
            result = play(TRACKS[job.track], job.task, self.policy_factory(job.seed),
                          make_sandbox=self.make_sandbox, max_turns=self.max_turns)
            cell = result.score.to_cell(job.track, job.repeat)
            return cell, bool(result.evidence.agent_error) and cell.scored()

        with concurrent.futures.ThreadPoolExecutor(max_workers=self.max_workers) as pool:
            futures = [pool.submit(one, job) for job in jobs]
            bar = tqdm(total=len(futures), desc="held-out eval", unit="cell", disable=not self.progress)
            for _ in concurrent.futures.as_completed(futures):
                bar.update(1)
            bar.close()
            results = [f.result() for f in futures]
        self.agent_failed = sum(failed for _, failed in results)
        return [cell for cell, _ in results]


@dataclasses.dataclass
class EngineCells:
    """CellRunner for a token-level policy: one E2E episode per held-out cell through the AgentLoop that GRPO
    rollouts use, scored by `tasks.episode.score_episode`. `judge` (optional) decides its rubric items; a cell
    it cannot decide is unscored. Prompts are rendered in `prompt_style`. After each call, `agent_failed` is the
    number of its cells whose sandbox the agent's own code brought down (`Trajectory.agent_error`) and that were
    still scored (`Cell.scored`), as the ledger counts them; scoring is not changed by it."""

    loop: AgentLoop
    judge: RubricJudge | None = None
    agent_failed: int = 0
    prompt_style: str = "full"

    def __call__(self, jobs: Sequence[EvalJob]) -> list[Cell]:
        requests = [request(f"eval-{i}", job.task.state(), job.task.brief, row_skill(E2E), E2E, self.prompt_style)
                    for i, job in enumerate(jobs)]
        trajectories = self.loop.run(requests, seed=jobs[0].seed if jobs else 0)
        by_request = {t.state_id: t for t in trajectories}
        cells = []
        for i, job in enumerate(jobs):
            evidence = evidence_of(by_request[f"eval-{i}"], requests[i].state)
            episode_score = score_episode(TRACKS[job.track], job.task, evidence, E2E, self.judge)
            cells.append(episode_score.to_cell(job.track, job.repeat))
        self.agent_failed = sum(bool(by_request[f"eval-{i}"].agent_error) and cell.scored()
                                for i, cell in enumerate(cells))
        return cells


def _cell_from_record(record: dict, where: str) -> Cell:
    """Parses one external per-cell record. Raises ValueError naming the record and field."""
    try:
        stages = {}
        given = record["stages"]
        for stage in STAGES:
            key = stage.value if stage.value in given else stage.title
            if key not in given:
                raise ValueError(f"field 'stages' has no {stage.value} ({stage.title}); use null or \"n/a\"")
            stages[stage] = NOT_APPLICABLE if given[key] == "n/a" else given[key]
        return Cell(track=str(record["track"]), repeat=int(record["repeat"]), stage_scores=stages,
                    task=record["task"])
    except KeyError as e:
        raise ValueError(f"{where}: missing field {e}") from None
    except (TypeError, ValueError, AttributeError) as e:
        raise ValueError(f"{where}: {e}") from None


@dataclasses.dataclass(frozen=True)
class ExternalEvaluator:
    """Runs an external staged benchmark and reads its per-cell scores back.

    Attributes:
      argv: command template; `{checkpoint}` and `{output}` are replaced in every argument.
      timeout_s: wall-clock limit of the command, seconds.
      scale: 1.0 when the command writes 0–1 scores, 100.0 when it writes 0–100.

    The command must write JSON to `{output}`: a list of per-cell records
    `{"track": str, "repeat": int, "stages": {"S1": x | null | "n/a", ..., "S5": ...}, "task": x | null}`
    (null = unscored, "n/a" = stage not applicable).
    """

    argv: tuple[str, ...]
    timeout_s: float = 24 * 3600.0
    scale: float = 1.0

    def __call__(self, checkpoint: str | pathlib.Path, workdir: str | pathlib.Path) -> Summary:
        """Runs the command for `checkpoint` and aggregates its cells.

        Raises:
          RuntimeError: the command failed (exit status and the tail of its stderr).
          ValueError: the output file is missing or malformed (the record and field are named).
        """
        output = pathlib.Path(workdir) / "external_eval.json"
        cmd = [a.format(checkpoint=str(checkpoint), output=str(output)) for a in self.argv]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=self.timeout_s)
        if proc.returncode != 0:
            raise RuntimeError(f"external evaluator {cmd!r} exited {proc.returncode}: {proc.stderr[-2000:]}")
        if not output.is_file():
            raise ValueError(f"external evaluator wrote no output file {output}")
        try:
            records = json.loads(output.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{output}: not valid JSON: {e}") from None
        if not isinstance(records, list):
            raise ValueError(f"{output}: expected a JSON list of per-cell records")
        cells = []
        for i, record in enumerate(records):
            if self.scale != 1.0:
                record = _rescale(record, self.scale)
            cells.append(_cell_from_record(record, f"{output}: record {i}"))
        return aggregate(cells)


def _rescale(record: dict, scale: float) -> dict:
    def r(v):
        return v / scale if isinstance(v, (int, float)) and not isinstance(v, bool) else v

    return {**record, "task": r(record.get("task")),
            "stages": {k: r(v) for k, v in dict(record.get("stages", {})).items()}}


def stage_scores(summary: Summary) -> dict[Stage, float | None]:
    """e_r: the stage scores the router reads (the only thing, with Overall, that reaches training)."""
    return dict(summary.stages)
