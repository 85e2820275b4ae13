"""The tabular data-analysis suite as a staged benchmark: four stages, three task families, a scripted teacher.

Details: docs/design.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

from bat_jax.clients.chat_endpoint import ChatEndpointConfig
from bat_jax.sandbox.readers import DecodeLimits
from bat_jax.staged_benchmark.contract import StagedBenchmark
from bat_jax.staged_benchmark.episode import ActionPolicy
from bat_jax.benchmarks.tabular import rubric as rubric_items
from bat_jax.benchmarks.tabular import tasks
from bat_jax.benchmarks.tabular.stages import LATE_STAGES, STAGES
from bat_jax.benchmarks.tabular.tables import TASK_FAMILIES, TOP_K, VARIANTS, answer_phrases
from bat_jax.benchmarks.tabular.tasks import TabularTask
from bat_jax.benchmarks.tabular.teacher import VERSION as TEACHER_VERSION, ScriptedTeacher
from bat_jax.verify.rubric import Rubric

METRICS = {
    "group_mean": "fraction of group means within 0.005",
    "filtered_median": "filtered median within 0.005 (1 or 0)",
    "top_corr": f"fraction of the top-{TOP_K} columns named with r within 0.005 (0 unless exactly {TOP_K} named)",
}


@dataclasses.dataclass(frozen=True)
class TabularBenchmark(StagedBenchmark):
    """The bundled tabular data-analysis suite (no settings: its tables, families and variants are fixed)."""

    name = "tabular"
    late_stages = LATE_STAGES
    teachers = ("scripted",)
    training_seeds = tasks.HELDOUT_SEED_BASE
    system_prompt = ("You are a data-analysis agent. Work through the stages of the task using the tools: "
                     "execute_code runs python or bash in the workspace, submit hands in the final file.")
    compact_system_prompt = ("Data agent. Tools: execute_code(language: python|bash, code) runs code in the "
                             "workspace; submit(path) hands in the result.")
    note = ("The bundled tabular suite: small generated CSV tables with seeded defects; held-out tables use their "
            "own seeds, ids and column vocabulary.")

    @property
    def stages(self):
        return STAGES

    @property
    def tracks(self) -> Mapping[str, str]:
        return {f: METRICS[f] for f in TASK_FAMILIES}

    @property
    def variants(self) -> tuple[str, ...]:
        return VARIANTS

    def training_task(self, track: str, seed: int, variant: str, template: int = 0) -> TabularTask:
        return tasks.training_task(track, seed, variant, template)

    def heldout_suite(self, n_per_track: int, variants: Sequence[str], suite_seed: int,
                      tracks: Iterable[str] | None = None) -> list[TabularTask]:
        return tasks.heldout_suite(n_per_track, variants, suite_seed, tracks)

    def manifest(self, tasks_: Iterable[TabularTask]) -> dict:
        return tasks.manifest(tasks_)

    def rubric(self, task: TabularTask) -> Rubric:
        return rubric_items.build_rubric(task)

    def score_task(self, task: TabularTask, files: Mapping[str, bytes], submitted: str | None,
                   limits: DecodeLimits) -> float | None:
        return rubric_items.score_task(task, files, submitted, limits)

    def stage_skill(self, stage: str) -> str:
        return tasks.stage_skill(stage)

    def judge_facts(self, task: TabularTask, item_id: str) -> str:
        """For 'report.written': the task id, the host's count of rows kept and its recomputed answer's phrases."""
        if item_id != "report.written":
            return ""
        phrases = "; ".join(answer_phrases(task.track, task.answer))
        return f"task id: {task.task_id}\nrows kept: {task.cleaned[1]['kept']}\nthe answer: {phrases}"

    def teacher(self, kind: str, endpoint: ChatEndpointConfig | None = None) -> ActionPolicy:
        if kind != "scripted":
            raise ValueError(f"benchmark 'tabular' has no teacher {kind!r}; known: {self.teachers}")
        return ScriptedTeacher()

    def recipe(self, teacher: str) -> str:
        """'teacher=scripted/<action texts version>'."""
        return f"teacher={teacher}/{TEACHER_VERSION}"
