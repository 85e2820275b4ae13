"""The held-out evaluator V(π) = (Overall M, stage scores e) (paper Eq. 1, Section 3), and an external adapter.

Details: docs/design.md.
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

from bat_jax.atomic_io import atomic_write
from bat_jax.benchmark.scoring import NOT_APPLICABLE, Cell, Summary, aggregate
from bat_jax.benchmark.stages import E2E, StageSet
from bat_jax.bicurl.reward import evidence_of
from bat_jax.errors import ConfigValueError
from bat_jax.prompts import PromptFormat, request
from bat_jax.rollout.agent_loop import AgentLoop
from bat_jax.rollout.play import play
from bat_jax.rollout.trajectory import infra_warning
from bat_jax.sandbox.backends import SandboxFactory
from bat_jax.staged_benchmark.contract import StagedBenchmark, Task
from bat_jax.staged_benchmark.episode import ActionPolicy
from bat_jax.verify.judge import RubricJudge

#: Suite seed offset per evaluation purpose (disjoint held-out tasks and policy seeds).
PURPOSES = {"controller": 0, "final": 1}
#: Suite seed of each suite the final evaluation can play: 'test' (the reported numbers) or 'dev' (tuning).
FINAL_SUITES = {"test": PURPOSES["final"], "dev": 2}


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """Held-out evaluation settings.

    Attributes:
      repeats: R repeats per track (paper: 10; the tiny default uses fewer).
      final_repeats: R of the final evaluation (the reported numbers), None = `repeats`; the controller's
        evaluation each round keeps `repeats` (cheaper, it only routes and accepts). More repeats narrow the final
        paired differences' minimum detectable difference (`benchmark.scoring.min_detectable_difference`).
      variants: outcome variants of the held-out tasks cycled over repeats (variants of the benchmark); None = the
        benchmark's held-out variants (`StagedBenchmark.eval_variants`; the imaging suite's: success, recovery).
      purpose: 'controller' (routing / acceptance each round) or 'final' (the reported numbers); the two use
        disjoint held-out tasks and policy seeds.
      tracks: track names of the benchmark, None = all of them.
      max_turns: assistant turns per episode.
      max_workers: episodes played concurrently (threads; sandbox calls release the GIL).
      seed: base seed of the policy's sampling.
      final_suite: the held-out suite the final evaluation plays: 'test' (the fixed suite of the reported numbers)
        or 'dev' (a development suite with its own suite seed: tune settings on it, then report once on 'test').
    """

    repeats: int = 10
    final_repeats: int | None = None
    variants: tuple[str, ...] | None = None
    purpose: str = "controller"
    tracks: tuple[str, ...] | None = None
    max_turns: int = 24
    max_workers: int = 4
    seed: int = 0
    final_suite: str = "test"

    def __post_init__(self):
        if self.final_suite not in FINAL_SUITES:
            raise ValueError(f"EvalConfig.final_suite must be one of {sorted(FINAL_SUITES)}, got {self.final_suite!r}")
        if self.purpose not in PURPOSES:
            raise ValueError(f"EvalConfig.purpose must be one of {sorted(PURPOSES)}, got {self.purpose!r}")
        if self.repeats < 1:
            raise ValueError(f"EvalConfig.repeats must be >= 1, got {self.repeats}")
        if self.final_repeats is not None and self.final_repeats < 1:
            raise ValueError(f"EvalConfig.final_repeats must be >= 1 or None, got {self.final_repeats}")

    @property
    def purpose_repeats(self) -> int:
        """R of this config's purpose: `final_repeats` (when set) for 'final', else `repeats`."""
        return self.final_repeats if self.purpose == "final" and self.final_repeats is not None else self.repeats

    @property
    def suite_seed(self) -> int:
        """The held-out suite this config plays: its purpose's, or `final_suite`'s for the final evaluation."""
        return FINAL_SUITES[self.final_suite] if self.purpose == "final" else PURPOSES[self.purpose]


@dataclasses.dataclass(frozen=True)
class EvalJob:
    """One cell to play: a held-out task, its repeat index and the policy seed for this repeat."""

    track: str
    repeat: int
    task: Task
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


def suite_jobs(config: EvalConfig, benchmark: StagedBenchmark) -> list[EvalJob]:
    """The cells of one evaluation.

    For each track, R repeats (`EvalConfig.purpose_repeats`) over the benchmark's held-out tasks of `config.purpose`.

    Raises:
      ValueError: a track or variant the benchmark does not have (names both and the benchmark).
    """
    variants = config.variants or benchmark.eval_variants()
    for name, values, known in (("tracks", config.tracks or (), tuple(benchmark.tracks)),
                                ("variants", variants, tuple(benchmark.variants))):
        unknown = [v for v in values if v not in known]
        if unknown:
            raise ConfigValueError(f"evaluation.EvalConfig.{name}: {unknown} are not {name} of benchmark "
                                   f"{benchmark.name!r} {known}")
    repeats = config.purpose_repeats
    per_variant = -(-repeats // len(variants))  # ceil
    suite = benchmark.heldout_suite(per_variant, variants, config.suite_seed, config.tracks)
    by_track: dict[str, list[Task]] = {}
    for inst in suite:
        by_track.setdefault(inst.track, []).append(inst)
    jobs = []
    seed_base = config.seed + 1_000_003 * config.suite_seed
    for track, insts in by_track.items():
        # interleave variants so that the first R tasks cover them evenly
        ordered = [insts[v * per_variant + k] for k in range(per_variant) for v in range(len(variants))]
        for repeat in range(repeats):
            jobs.append(EvalJob(track, repeat, ordered[repeat % len(ordered)], seed_base + repeat))
    return jobs


def heldout_manifest(config: EvalConfig, benchmark: StagedBenchmark) -> dict:
    """The held-out manifest of every task `config` may play: the controller's suite and both final suites.

    It comes from `StagedBenchmark.manifest` and is what the Stage Bank's leakage preflight guards against."""
    configs = [dataclasses.replace(config, purpose="controller")]
    configs += [dataclasses.replace(config, purpose="final", final_suite=suite) for suite in FINAL_SUITES]
    return benchmark.manifest([job.task for c in configs for job in suite_jobs(c, benchmark)])


def write_heldout_manifest(path: pathlib.Path, config: EvalConfig, benchmark: StagedBenchmark) -> pathlib.Path:
    """Writes `heldout_manifest` as JSON to `path` all or nothing; returns `path`."""
    atomic_write(path, json.dumps(heldout_manifest(config, benchmark), indent=1, default=str).encode())
    return pathlib.Path(path)


def evaluate(run_cells: CellRunner, config: EvalConfig, benchmark: StagedBenchmark) -> Summary:
    """Plays the benchmark's held-out suite and returns only its aggregate (two-level means, half-widths)."""
    jobs = suite_jobs(config, benchmark)
    cells = run_cells(jobs)
    if len(cells) != len(jobs):
        raise RuntimeError(f"cell runner returned {len(cells)} cells for {len(jobs)} jobs")
    return aggregate(cells, benchmark.stages)


@dataclasses.dataclass
class PolicyCells:
    """A CellRunner for action-level policies (scripted expert, OpenAI-compatible teacher, baselines).

    Attributes:
      benchmark: the benchmark whose tasks the cells are (scoring, stage skills).
      policy_factory: seed → `staged_benchmark.episode.ActionPolicy` (a callable Conversation → Action | None).
      make_sandbox: SandboxState → Sandbox (Docker in real runs; see `sandbox.backends.backend_factory`).
      max_turns: assistant turns per episode.
      max_workers: episodes in flight at once.
      progress: tqdm progress bar.
      agent_failed: after each call, its scored cells whose sandbox the agent's code brought down
        (`verify.rubric.Evidence.agent_error`).
    """

    benchmark: StagedBenchmark
    policy_factory: Callable[[int], ActionPolicy]
    make_sandbox: SandboxFactory
    max_turns: int = 24
    max_workers: int = 4
    progress: bool = True
    agent_failed: int = 0

    def __call__(self, jobs: Sequence[EvalJob]) -> list[Cell]:
        def one(job: EvalJob) -> tuple[Cell, bool]:
            result = play(self.benchmark, job.task, self.policy_factory(job.seed),
                          make_sandbox=self.make_sandbox, max_turns=self.max_turns)
            cell = result.score.to_cell(job.track, job.repeat, self.benchmark.stages)
            return cell, bool(result.evidence.agent_error) and cell.scored(self.benchmark.stages)

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
    """CellRunner for a token-level policy: one E2E episode per held-out cell.

    Episodes run through the AgentLoop that GRPO rollouts use, scored by `StagedBenchmark.score_episode`. `judge`
    (optional) decides its rubric items; a cell it cannot decide is unscored. Prompts are rendered in `prompt`'s format.
    After each call, `agent_failed` is the number of its cells whose sandbox the agent's own code brought down
    (`Trajectory.agent_error`) and that were still scored (`Cell.scored`), as the ledger counts them; scoring is not
    changed by it."""

    loop: AgentLoop
    benchmark: StagedBenchmark
    judge: RubricJudge | None = None
    agent_failed: int = 0
    prompt: PromptFormat = PromptFormat()

    def __call__(self, jobs: Sequence[EvalJob]) -> list[Cell]:
        bench = self.benchmark
        requests = [request(f"eval-{i}", job.task.state(), job.task.brief, bench.row_skill(E2E), E2E, self.prompt)
                    for i, job in enumerate(jobs)]
        trajectories = self.loop.run(requests, seed=jobs[0].seed if jobs else 0)
        by_request = {t.state_id: t for t in trajectories}
        cells = []
        for i, job in enumerate(jobs):
            evidence = evidence_of(by_request[f"eval-{i}"], requests[i].state)
            episode_score = bench.score_episode(job.task, evidence, E2E, self.judge)
            cells.append(episode_score.to_cell(job.track, job.repeat, bench.stages))
        self.agent_failed = sum(bool(by_request[f"eval-{i}"].agent_error) and cell.scored(bench.stages)
                                for i, cell in enumerate(cells))
        warning = infra_warning(trajectories, "held-out cells", "left out of the means")
        if warning:  # otherwise only a count in the ledger: say why
            print(warning, flush=True)
        return cells


def _cell_from_record(record: dict, where: str, stage_set: StageSet) -> Cell:
    """Parses one external per-cell record in the benchmark's stages (ids or titles as keys).

    Raises ValueError naming the record and field."""
    try:
        stages = {}
        given = record["stages"]
        for stage in stage_set.ids:
            title = stage_set.title(stage)
            key = stage if stage in given else title
            if key not in given:
                raise ValueError(f"field 'stages' has no {stage} ({title}); use null or \"n/a\"")
            stages[stage] = NOT_APPLICABLE if given[key] == "n/a" else given[key]
        unknown = [k for k in given if k not in stage_set.ids and k not in (stage_set.title(s) for s in stage_set)]
        if unknown:
            raise ValueError(f"field 'stages' names {unknown}, not stages of benchmark {stage_set.benchmark!r}")
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
    `{"track": str, "repeat": int, "stages": {<stage id or title>: x | null | "n/a", ...}, "task": x | null}`, one
    entry per stage of the benchmark (null = unscored, "n/a" = stage not applicable).
    """

    argv: tuple[str, ...]
    timeout_s: float = 24 * 3600.0
    scale: float = 1.0

    def __call__(self, checkpoint: str | pathlib.Path, workdir: str | pathlib.Path, stages: StageSet) -> Summary:
        """Runs the command for `checkpoint` and aggregates its cells over the benchmark's `stages`.

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
            cells.append(_cell_from_record(record, f"{output}: record {i}", stages))
        return aggregate(cells, stages)


def _rescale(record: dict, scale: float) -> dict:
    def r(v):
        return v / scale if isinstance(v, (int, float)) and not isinstance(v, bool) else v

    return {**record, "task": r(record.get("task")),
            "stages": {k: r(v) for k, v in dict(record.get("stages", {})).items()}}
