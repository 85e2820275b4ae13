"""The staged-benchmark plug-in: what a benchmark declares so that BiCuRL can use it as the teacher.

Details: docs/design.md.
"""

from __future__ import annotations

import abc
import dataclasses
import numbers
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from bat_jax.benchmark.stages import E2E, StageSet
from bat_jax.clients.chat_endpoint import ChatEndpointConfig
from bat_jax.errors import ConfigValueError
from bat_jax.staged_benchmark.episode import ActionPolicy
from bat_jax.sandbox.readers import DEFAULT_LIMITS, DecodeLimits
from bat_jax.sandbox.types import SandboxState
from bat_jax.verify.judge import RubricJudge
from bat_jax.verify.rubric import EpisodeScore, Evidence, Rubric, ScorerError, score


class Task(Protocol):
    """What the core reads of one task of a benchmark (the rest — hidden answers — stays the benchmark's)."""

    task_id: str
    track: str
    brief: str

    def state(self) -> SandboxState:
        """The executable initial sandbox state p (the workspace the agent starts in)."""


@dataclasses.dataclass(frozen=True)
class Reduction:
    """λ of the E2E surrogate R_λ (paper Eq. 12): what a benchmark's `reduce_task` keeps of a task.

    Attributes:
      cases: λ_case, cases (items of work) kept (≥ 1).
      input_fraction: λ_input in (0, 1], fraction of each input kept.
      validation_passes: λ_validate ≥ 1, most validation passes the surrogate allows (`Accept`, Eq. 15).
    """

    cases: int = 2
    input_fraction: float = 1.0
    validation_passes: int = 1

    def validate(self) -> None:
        """Raises ValueError naming the bad field."""
        if isinstance(self.cases, bool) or not isinstance(self.cases, int) or self.cases < 1:
            raise ValueError(f"Reduction.cases (λ_case) must be an int >= 1, got {self.cases!r}")
        if not (isinstance(self.input_fraction, (int, float)) and 0.0 < self.input_fraction <= 1.0):
            raise ValueError(f"Reduction.input_fraction (λ_input) must be in (0, 1], got {self.input_fraction!r}")
        if (isinstance(self.validation_passes, bool) or not isinstance(self.validation_passes, int)
                or self.validation_passes < 1):
            raise ValueError(f"Reduction.validation_passes (λ_validate) must be an int >= 1, "
                             f"got {self.validation_passes!r}")


class BenchmarkError(ConfigValueError):
    """A benchmark definition that cannot be used; the message names the benchmark and the field."""


class MetricError(BenchmarkError, ScorerError):
    """A `score_task` result that is not None or a finite number in [0, 1]: the benchmark's error, never the agent's.

    A `ScorerError` (reward code re-raises it, never scores it 0) that launch prints as one line."""


class StagedBenchmark(abc.ABC):
    """A staged benchmark B = (S, C, V) as a plug-in.

    Subclasses are usually frozen dataclasses: their fields are the benchmark's settings, bound in gin, and equal
    settings give equal objects.

    Subclasses declare, as class attributes or properties:
      name: short identifier ('imaging'), used in reports, ledgers and error messages.
      stages: the ordered stages and their Agentic weights (`benchmark.stages.StageSet`).
      tracks: task family → the name of its task metric (every family has one).
      variants: outcome variants of its tasks (the factory's outcome buckets), e.g. ('success', 'failure').
      heldout_variants: the variants its held-out evaluation plays by default (`EvalConfig.variants` None);
        default: all of `variants`.
      late_stages: the stages the released non-inferiority gate holds to its late-stage margin.
      teachers: the teacher kinds `teacher` accepts (the Data Factory's `FactoryConfig.teacher`).
      has_e2e_surrogate: whether `reduce_task` gives E2E surrogates (else E2E rows start at the whole task).
      training_seeds: training task seeds are < this; held-out seeds are not (disjoint by construction).
      note: one line for reports (what the held-out suite is).
      system_prompt, compact_system_prompt: the agent's system prompt in the 'full' and 'compact' prompt styles
        (`prompts.PromptFormat`): its role and the two tools.
      sandbox_packages: the Debian (bookworm) packages of its own sandbox image, e.g. ('python3', 'python3-pandas');
        None (default): the shared image of `sandboxes/packages.txt` (python3, numpy, scipy, nibabel, PIL). A run on
        Docker builds the image once when missing (`sandbox_image`).
    and implement the abstract methods below.
    """

    name: str = "benchmark"
    heldout_variants: tuple[str, ...] | None = None
    system_prompt: str = ("You are a research agent. Work through the stages of the task using the tools: "
                          "execute_code runs python or bash in the workspace, submit hands in the final file.")
    compact_system_prompt: str = ("Agent. Tools: execute_code(language: python|bash, code) runs code in the "
                                  "workspace; submit(path) hands in the result.")
    late_stages: tuple[str, ...] = ()
    teachers: tuple[str, ...] = ("scripted",)
    has_e2e_surrogate: bool = False
    training_seeds: int = 1_000_000_000
    note: str = ""
    sandbox_packages: tuple[str, ...] | None = None

    def __new__(cls, *args, **kwargs):
        """Refuses a subclass that leaves abstract methods unimplemented, naming them (not Python's TypeError).

        Raises:
          BenchmarkError: naming the benchmark, its class and the missing methods.
        """
        missing = sorted(getattr(cls, "__abstractmethods__", ()))
        if missing:
            raise BenchmarkError(f"benchmark {cls.name!r} ({cls.__module__}.{cls.__qualname__}) does not implement "
                                 f"{', '.join(missing)} (abstract methods of StagedBenchmark)")
        return super().__new__(cls)

    # ---- what the benchmark is ------------------------------------------------------------------------------
    @property
    @abc.abstractmethod
    def stages(self) -> StageSet:
        """The ordered stages and their Agentic weights."""

    @property
    @abc.abstractmethod
    def tracks(self) -> Mapping[str, str]:
        """Task family → name of its task metric, in the benchmark's order."""

    @property
    @abc.abstractmethod
    def variants(self) -> tuple[str, ...]:
        """Outcome variants of its tasks (the factory's outcome buckets)."""

    # ---- tasks ------------------------------------------------------------------------------------------------
    @abc.abstractmethod
    def training_task(self, track: str, seed: int, variant: str, template: int = 0) -> Task:
        """A training (Stage Bank) task of family `track`: seed < `training_seeds`, never a held-out one.

        Raises:
          ValueError: an unknown track or variant, or a held-out seed or template.
        """

    def source_template(self, digest: str) -> int:
        """The brief template of a Data Factory source, from the hex digest of its grid cell (default 0)."""
        return 0

    @abc.abstractmethod
    def heldout_suite(self, n_per_track: int, variants: Sequence[str], suite_seed: int,
                      tracks: Iterable[str] | None = None) -> list[Task]:
        """The held-out tasks: per track, `n_per_track` per variant.

        `suite_seed` selects a disjoint slice (the controller's and the final evaluation use two). Disjoint from every
        training task by construction."""

    @abc.abstractmethod
    def manifest(self, tasks: Iterable[Task]) -> dict:
        """The held-out manifest of `tasks` for the leakage firewall.

        It holds what no Stage Bank row may contain (`stage_bank.leakage.HeldOutManifest.from_task_manifest` reads it:
        task ids, paths, texts, answers)."""

    # ---- the contract and the evaluation ---------------------------------------------------------------------
    @abc.abstractmethod
    def rubric(self, task: Task) -> Rubric:
        """The reward contract (c, G) of `task`: binary items, each tagged with one of `stages`, and evidence."""

    @abc.abstractmethod
    def score_task(self, task: Task, files: Mapping[str, bytes], submitted: str | None,
                   limits: DecodeLimits) -> float | None:
        """The task metric of an episode of `task` (0–1); None = unscored.

        It is read from the final workspace `files` (decoded within `limits` by total readers: what the agent wrote
        never raises) and the submitted path."""

    @abc.abstractmethod
    def stage_skill(self, stage: str) -> str:
        """The public stage skill κ of stage id `stage` (goal, checks, recovery steps)."""

    def compact_user_message(self, text: str) -> str:
        """The terse form of a first user turn (brief + stage skills) for small policies ('compact' prompts).

        Default: unchanged."""
        return text

    # ---- the Data Factory -------------------------------------------------------------------------------------
    @abc.abstractmethod
    def teacher(self, kind: str, endpoint: ChatEndpointConfig | None = None) -> ActionPolicy:
        """A teacher of kind `kind` (one of `teachers`).

        It is an action policy that solves this benchmark's tasks, naming each action's stage
        (`sandbox.tools.Action.stage`)."""

    def sandbox_image(self) -> str | None:
        """The tag of its own sandbox image (`sandbox.images.task_tag` of `sandbox_packages`).

        None for the shared one. Raises ValueError for a package name that is not one."""
        if self.sandbox_packages is None:
            return None
        from bat_jax.sandbox import images  # docker-py: only for a benchmark with its own image

        return images.task_tag(pkgs=tuple(self.sandbox_packages))

    def recipe(self, teacher: str) -> str:
        """What a bank version's note records of how its rows were made.

        `stage_bank.factory.check_recipe` refuses to mix two recipes in one bank. Default: 'teacher=<kind>'."""
        return f"teacher={teacher}"

    def reduce_task(self, task: Task, reduction: Reduction, template: int) -> tuple[Task, dict]:
        """R_λ(ξ): the E2E surrogate of `task` and the parameters actually applied (recorded in provenance).

        Only called when `has_e2e_surrogate`."""
        raise NotImplementedError(f"benchmark {self.name!r} has no E2E surrogate")

    def judge_facts(self, task: Task, item_id: str) -> str:
        """What the host knows that the LLM judge needs to decide item `item_id` of `task` (e.g. the recomputed answer).

        Shown to the judge as the host's words, never to the agent. Default: '' (none)."""
        return ""

    def validation_passes(self, evidence: Evidence, task: Task) -> int:
        """Validation passes an E2E surrogate episode spent (Accept's λ_validate budget); default 0."""
        return 0

    # ---- what the core derives (not to override) ---------------------------------------------------------------
    def row_skill(self, focus: str) -> str:
        """κ of a row: the stage skill, or for E2E every stage's skill in workflow order (Appendix A.1)."""
        stages = self.stages.ids if focus == E2E else (self.stages.parse(focus),)
        return "\n\n".join(self.stage_skill(s) for s in stages)

    def row_prompt(self, task: Task, focus: str) -> str:
        """The prompt a row's agent sees first: the brief, plus for a stage row where the rollout starts."""
        if focus == E2E:
            return task.brief
        stage = self.stages.parse(focus)
        done = ", ".join(self.stages.label(s) for s in self.stages.ids[:self.stages.index(stage)]) or "none"
        label = self.stages.label(stage)
        return (f"{task.brief}\n## Current stage\nYou start at the boundary of stage {label}. "
                f"Stages already completed in this workspace: {done}. Do the work of {stage} only, then stop.\n")

    def score_episode(self, task: Task, evidence: Evidence, focus: str = E2E,
                      judge: RubricJudge | None = None) -> EpisodeScore:
        """The one score of an episode of `task` (paper Eq. 4; E2E as the released code scores it).

        The task's rubric (the items `judge` is configured for decided by the LLM judge) is verified on the stages
        of `focus`: every stage for 'E2E', that stage alone otherwise. The task metric is computed for an E2E
        episode only; a stage-focus score is its stage's r and carries task None. Evidence of an infrastructure
        failure gives an unscored score (reward None), never 0.

        Raises:
          ValueError: an unknown focus.
          verify.rubric.ScorerError: a task metric that is not a finite number in [0, 1].
        """
        rubric = self.rubric(task)
        if judge is not None:
            rubric = judge.apply(rubric, task.brief, lambda item_id: self.judge_facts(task, item_id))
        metric = None
        if focus == E2E and not evidence.infra_error:
            metric = self.task_metric(task, evidence.files, evidence.submitted, evidence.limits)
        return score(rubric, evidence, metric, self.stages.parse_focus(focus))

    def task_metric(self, task: Task, files: Mapping[str, bytes], submitted: str | None,
                    limits: DecodeLimits) -> float | None:
        """`score_task`, checked: None (unscored) or a number in [0, 1], as a float.

        Raises:
          MetricError: anything else (NaN, 1.7, a string), naming the benchmark, the task and the value.
        """
        metric = self.score_task(task, files, submitted, limits)
        if metric is None:
            return None
        if not isinstance(metric, numbers.Real) or not 0.0 <= float(metric) <= 1.0:  # NaN fails too
            raise MetricError(f"benchmark {self.name!r}: score_task returned {metric!r} for task {task.task_id!r} "
                              f"(submitted {submitted!r}); it must return None or a number in [0, 1]")
        return float(metric)

    def validate(self) -> None:
        """Checks the definition before any work.

        It checks stages, late stages, tracks and their metrics, variants, teachers, and one training task per track
        (its rubric's items must name stages it has, every stage must have one); the held-out suite (not empty) and
        its manifest's shape (`check_manifest`); and on the starting workspace of those tasks and one held-out task,
        `score_task` and every rubric check (`check_on_start`).

        Raises:
          BenchmarkError: naming the benchmark and the field.
        """
        where = f"benchmark {self.name!r}"
        try:
            stages = self.stages
            if not isinstance(stages, StageSet):
                raise BenchmarkError(f"{where}: stages must be a StageSet, got {type(stages).__name__}")
        except ValueError as e:
            raise BenchmarkError(str(e)) from None
        unknown = [s for s in self.late_stages if s not in stages]
        if unknown:
            raise BenchmarkError(f"{where}: late_stages {unknown} are not among its stages {list(stages.ids)}")
        if not self.tracks:
            raise BenchmarkError(f"{where}: tracks is empty (declare at least one task family and its metric)")
        for track, metric in self.tracks.items():
            if not isinstance(metric, str) or not metric.strip():
                raise BenchmarkError(f"{where}: task family {track!r} has no task metric (tracks[{track!r}])")
        if not self.variants:
            raise BenchmarkError(f"{where}: variants is empty")
        unknown = [v for v in self.eval_variants() if v not in self.variants]
        if unknown:
            raise BenchmarkError(f"{where}: heldout_variants {unknown} are not among its variants {self.variants}")
        if not self.teachers:
            raise BenchmarkError(f"{where}: teachers is empty (the Data Factory needs one)")
        try:
            self.sandbox_image()
        except ValueError as e:
            raise BenchmarkError(f"{where}: sandbox_packages: {e}") from None
        for track in self.tracks:
            task = self.training_task(track, 0, self.variants[0])
            try:
                rubric = self.rubric(task)
            except ValueError as e:
                raise BenchmarkError(f"{where}: rubric of task family {track!r}: {e}") from None
            bare = [s for s in stages.ids if not rubric.for_stage(s)]
            if bare:
                raise BenchmarkError(f"{where}: task family {track!r} has no rubric item for stages {bare}")
        suite = self.heldout_suite(1, self.eval_variants()[:1], 0)
        if not suite:
            raise BenchmarkError(f"{where}: its held-out suite is empty, so there is no held-out manifest to guard")
        check_manifest(self.manifest(suite), suite, where)
        for task in [self.training_task(track, 0, self.variants[0]) for track in self.tracks] + list(suite):
            check_on_start(self, task, where)

    def rubric_item_ids(self) -> tuple[str, ...]:
        """Every rubric item id of this benchmark's tasks: over each track and variant's first training task."""
        ids = {i.item_id: None for t in self.tracks for v in self.variants
               for i in self.rubric(self.training_task(t, 0, v)).items}
        return tuple(ids)

    def check_judged_items(self, items: Sequence[str]) -> None:
        """Raises BenchmarkError naming `JudgeConfig.items` when one of `items` is no rubric item of this benchmark."""
        known = self.rubric_item_ids()
        unknown = [i for i in items if i not in known]
        if unknown:
            raise BenchmarkError(f"JudgeConfig.items {unknown} are not rubric items of benchmark {self.name!r} "
                                 f"(its items: {list(known)})")

    def eval_variants(self) -> tuple[str, ...]:
        """The variants the held-out evaluation plays by default: `heldout_variants`, else every variant."""
        return tuple(self.heldout_variants or self.variants)

    def check_focus(self, focus: str, where: str) -> str:
        """`focus` as an id ('E2E' or one of `stages`).

        Raises:
          BenchmarkError: naming `where` (e.g. a bank row), the focus and the benchmark's stages.
        """
        try:
            return self.stages.parse_focus(focus)
        except ValueError:
            raise BenchmarkError(f"{where}: focus {focus!r} is not a stage of benchmark {self.name!r} "
                                 f"(stages {list(self.stages.ids)}, or 'E2E')") from None


def describe(benchmark: StagedBenchmark) -> dict[str, Any]:
    """A benchmark's public definition as JSON-ready values (for run directories and error messages)."""
    return {"name": benchmark.name, "stages": [dataclasses.asdict(s) for s in benchmark.stages.stages],
            "tracks": dict(benchmark.tracks), "variants": list(benchmark.variants),
            "late_stages": list(benchmark.late_stages), "teachers": list(benchmark.teachers),
            "has_e2e_surrogate": benchmark.has_e2e_surrogate}


def check_manifest(manifest: Any, suite: Sequence[Task], where: str) -> None:
    """Checks a held-out manifest's shape: {'tasks': [{'task_id': str, 'paths': [str], 'cases': [{...}]}]}.

    Every task of `suite` must have an entry (`stage_bank.leakage.HeldOutManifest.from_task_manifest` reads it).

    Raises:
      BenchmarkError: naming `where` (the benchmark) and the field.
    """
    shape = "{'tasks': [{'task_id': str, 'paths': [str], 'cases': [dict]}]}"
    if not isinstance(manifest, Mapping):
        raise BenchmarkError(f"{where}: manifest(tasks) must return a dict {shape}, got a {type(manifest).__name__}")
    entries = manifest.get("tasks")
    if not isinstance(entries, list) or not entries:
        raise BenchmarkError(f"{where}: manifest(tasks)['tasks'] must be a non-empty list of task entries {shape}, "
                             f"got {entries!r:.80}")
    for i, entry in enumerate(entries):
        field = f"manifest(tasks)['tasks'][{i}]"
        if not isinstance(entry, Mapping) or not isinstance(entry.get("task_id"), str) or not entry["task_id"]:
            raise BenchmarkError(f"{where}: {field} must be a dict with a non-empty 'task_id' string, "
                                 f"got {entry!r:.80}")
        paths, cases = entry.get("paths", []), entry.get("cases", [])
        if not isinstance(paths, (list, tuple)) or not all(isinstance(p, str) for p in paths):
            raise BenchmarkError(f"{where}: {field}['paths'] must be a list of path strings, got {paths!r:.80}")
        if not isinstance(cases, (list, tuple)) or not all(isinstance(c, Mapping) for c in cases):
            raise BenchmarkError(f"{where}: {field}['cases'] must be a list of dicts, got {cases!r:.80}")
    listed = {entry["task_id"] for entry in entries}
    missing = [t.task_id for t in suite if t.task_id not in listed]
    if missing:
        raise BenchmarkError(f"{where}: manifest(tasks) has no entry for held-out tasks {missing} "
                             f"(each task's 'task_id')")


def check_on_start(benchmark: StagedBenchmark, task: Task, where: str) -> None:
    """Runs `score_task` and every rubric check on `task`'s starting workspace, where no call has run yet.

    `score_task` must return None or a number in [0, 1] and not raise (a missing file is read as None by the
    readers). A check may raise on a missing or malformed file (a failed check), but not a NameError or an
    AttributeError of the evidence itself (a misspelt name in its code: it would fail on every episode).

    Raises:
      BenchmarkError: naming `where` (the benchmark), the task and the method, item or evidence.
    """
    files = dict(task.state().files)
    evidence = Evidence((), files, None, start_files=files)
    start = f"on the starting workspace of task {task.task_id!r} (no call has run)"
    try:
        benchmark.task_metric(task, evidence.files, None, DEFAULT_LIMITS)
    except MetricError:
        raise
    except Exception as e:  # noqa: BLE001 - any exception is the benchmark's: nothing was written yet
        raise BenchmarkError(f"{where}: score_task raised {type(e).__name__}: {e} {start}; it must return 0 or None "
                             f"when the answer is missing") from None
    rubric = benchmark.rubric(task)
    checks = [(f"evidence {r.key!r}", r.check) for r in rubric.requirements.values()]
    checks += [(f"rubric item {i.item_id!r}", i.check) for i in rubric.items]
    for name, check in checks:
        try:
            check(evidence)
        except (NameError, AttributeError) as e:  # a check that raises on a missing or malformed file fails; these
            if isinstance(e, AttributeError) and getattr(e, "obj", None) is not evidence:  # are its own code's
                continue
            raise BenchmarkError(f"{where}: {name} check raised {type(e).__name__}: {e} {start}; what a check "
                                 f"receives: bat_jax.staged_benchmark.api.Evidence") from None
        except Exception:  # noqa: BLE001 - a failed check, as `verify.rubric` scores it
            continue
