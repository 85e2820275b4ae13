"""The medical-imaging suite as a staged benchmark: five stages, seven fictional track families, three teachers.

Details: docs/design.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

from bat_jax.clients.chat_endpoint import ChatEndpointConfig
from bat_jax.sandbox.readers import DecodeLimits
from bat_jax.staged_benchmark.contract import Reduction, StagedBenchmark
from bat_jax.staged_benchmark.episode import ActionPolicy
from bat_jax.benchmarks.imaging import e2e_reduce, heldout
from bat_jax.benchmarks.imaging.base import VARIANTS, TaskInstance
from bat_jax.benchmarks.imaging.brief import VARIED_TEMPLATE_BASE, compact_user_message, stage_skill
from bat_jax.benchmarks.imaging.portable_expert import VERSION as PORTABLE_VERSION, PortableExpert
from bat_jax.benchmarks.imaging.registry import TRACKS
from bat_jax.benchmarks.imaging.rubric import build_rubric
from bat_jax.benchmarks.imaging.stages import LATE_STAGES, STAGES
from bat_jax.benchmarks.imaging.teacher import ChatTeacher, ScriptedExpert
from bat_jax.verify.rubric import Evidence, Rubric

LAYOUTS = ("fixed", "varied")


@dataclasses.dataclass(frozen=True)
class ImagingBenchmark(StagedBenchmark):
    """The bundled medical-imaging suite (this project's own, not AutoMedBench-Lite).

    Attributes:
      layouts: training task layouts: 'fixed' (every task in `tasks.layout.TRAIN_LAYOUT`, 'tr' ids) or 'varied'
        (paths and id prefix drawn from the task seed, `tasks.layout.varied_naming`: a policy must read them from
        the brief). Held-out tasks always use the held-out layout.
      cases_per_task: cases per generated training task; 0 keeps each track's default (4 or 6).
    Raises:
      ValueError: an unknown layout or a case count of 1 or below 0 (the message names the field).
    """

    layouts: str = "fixed"
    cases_per_task: int = 0

    name = "imaging"
    heldout_variants = ("success", "recovery")
    late_stages = LATE_STAGES
    teachers = ("scripted", "portable", "openai")
    has_e2e_surrogate = True
    training_seeds = heldout.HELDOUT_SEED_BASE
    system_prompt = ("You are a medical-imaging research agent. Work through the stages of the task using the "
                     "tools: execute_code runs python or bash in the workspace, submit hands in the final file.")
    compact_system_prompt = ("Imaging agent. Tools: execute_code(language: python|bash, code) runs code in the "
                             "workspace; submit(path) hands in the result.")
    note = ("The bundled held-out suite is this project's own (seven fictional track families of the same kinds as "
            "AutoMedBench-Lite); its numbers are not comparable to the paper's.")

    def __post_init__(self):
        if self.layouts not in LAYOUTS:
            raise ValueError(f"ImagingBenchmark.layouts must be one of {LAYOUTS}, got {self.layouts!r}")
        if self.cases_per_task < 0 or self.cases_per_task == 1:
            raise ValueError(f"ImagingBenchmark.cases_per_task must be 0 (track default) or >= 2, "
                             f"got {self.cases_per_task}")

    @property
    def stages(self):
        return STAGES

    @property
    def tracks(self) -> Mapping[str, str]:
        return {name: track.metric_name for name, track in TRACKS.items()}

    @property
    def variants(self) -> tuple[str, ...]:
        return VARIANTS

    def _track(self, name: str):
        """The registry's track (a copy with `cases_per_task` cases when set).

        Raises ValueError for an unknown one."""
        if name not in TRACKS:
            raise ValueError(f"benchmark 'imaging' has no track {name!r}; known: {sorted(TRACKS)}")
        track = TRACKS[name]
        if self.cases_per_task:
            track = type(track)()
            track.n_cases = self.cases_per_task
        return track

    def training_task(self, track: str, seed: int, variant: str, template: int = 0) -> TaskInstance:
        return heldout.training_task(self._track(track), seed, variant, template)

    def source_template(self, digest: str) -> int:
        """Wording 0 or 1 from the digest, plus `VARIED_TEMPLATE_BASE` with varied layouts."""
        return int(digest[12], 16) % 2 + (VARIED_TEMPLATE_BASE if self.layouts == "varied" else 0)

    def heldout_suite(self, n_per_track: int, variants: Sequence[str], suite_seed: int,
                      tracks: Iterable[str] | None = None) -> list[TaskInstance]:
        return heldout.heldout_suite(n_per_track, variants, suite_seed, tracks)

    def manifest(self, tasks: Iterable[TaskInstance]) -> dict:
        return heldout.manifest(tasks)

    def rubric(self, task: TaskInstance) -> Rubric:
        return build_rubric(TRACKS[task.track], task)

    def score_task(self, task: TaskInstance, files: Mapping[str, bytes], submitted: str | None,
                   limits: DecodeLimits) -> float | None:
        return TRACKS[task.track].score_task(task, files, submitted, limits)

    def stage_skill(self, stage: str) -> str:
        return stage_skill(stage)

    def compact_user_message(self, text: str) -> str:
        return compact_user_message(text)

    def teacher(self, kind: str, endpoint: ChatEndpointConfig | None = None) -> ActionPolicy:
        if kind == "scripted":
            return ScriptedExpert()
        if kind == "portable":
            return PortableExpert()
        if kind == "openai":
            if endpoint is None:
                raise ValueError("the 'openai' teacher needs a ChatEndpointConfig (factory.FactoryConfig.teacher_endpoint)")
            return ChatTeacher(endpoint)
        raise ValueError(f"benchmark 'imaging' has no teacher {kind!r}; known: {self.teachers}")

    def recipe(self, teacher: str) -> str:
        """The recipe 'teacher=<kind>[/<portable version>] layouts=<layouts>'.

        Rows of the portable expert carry its action texts' version, since rows of two versions must not be trained on
        together."""
        kind = f"{teacher}/{PORTABLE_VERSION}" if teacher == "portable" else teacher
        return f"teacher={kind} layouts={self.layouts}"

    def reduce_task(self, task: TaskInstance, reduction: Reduction, template: int) -> tuple[TaskInstance, dict]:
        return e2e_reduce.reduce_task(TRACKS[task.track], task, reduction, template)

    def validation_passes(self, evidence: Evidence, task: TaskInstance) -> int:
        return e2e_reduce.validation_passes(evidence, task)
