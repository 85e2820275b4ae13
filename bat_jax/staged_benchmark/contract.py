"""The staged-benchmark plug-in: what a benchmark declares so that BiCuRL can use it as the teacher.

Details: docs/design.md.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from bat_jax.benchmark.stages import E2E, StageSet
from bat_jax.clients.chat_endpoint import ChatEndpointConfig
from bat_jax.errors import ConfigValueError
from bat_jax.staged_benchmark.episode import ActionPolicy
from bat_jax.sandbox.readers import DecodeLimits
from bat_jax.sandbox.types import SandboxState
from bat_jax.verify.judge import RubricJudge
from bat_jax.verify.rubric import EpisodeScore, Evidence, Rubric, score


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
            metric = self.score_task(task, evidence.files, evidence.submitted, evidence.limits)
        return score(rubric, evidence, metric, self.stages.parse_focus(focus))

    def validate(self) -> None:
        """Checks the definition before any work.

        It checks stages, late stages, tracks and their metrics, variants, teachers, and one training task per track
        (its rubric's items must name stages it has, every stage must have one). A missing held-out suite is refused
        too.

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
        for track in self.tracks:
            task = self.training_task(track, 0, self.variants[0])
            try:
                rubric = self.rubric(task)
            except ValueError as e:
                raise BenchmarkError(f"{where}: rubric of task family {track!r}: {e}") from None
            bare = [s for s in stages.ids if not rubric.for_stage(s)]
            if bare:
                raise BenchmarkError(f"{where}: task family {track!r} has no rubric item for stages {bare}")
        if not self.manifest(self.heldout_suite(1, self.eval_variants()[:1], 0)).get("tasks"):
            raise BenchmarkError(f"{where}: its held-out suite is empty, so there is no held-out manifest to guard")

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
