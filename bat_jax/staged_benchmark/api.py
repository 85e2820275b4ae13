"""The names a benchmark author imports: `from bat_jax.staged_benchmark.api import StagedBenchmark, Evidence, ...`.

Each is the core's own object, documented below in one `#:` line; the example outside the package
(`tests/fixtures/wordcount/wordcount.py`) imports nothing else of bat_jax.
"""

#: `StagedBenchmark`: the class to subclass (name, stages, tracks, variants, tasks, held-out suite, manifest, rubric,
#: score_task, stage skills, teacher); `validate` checks it at launch. `Task`: what the core reads of a task
#: (`task_id`, `track`, `brief`, `state()`). `BenchmarkError`: a check's error, naming the benchmark and the field.
from bat_jax.staged_benchmark.contract import BenchmarkError, StagedBenchmark, Task

#: `StageSet`: the stages, `StageSet.of([(id, title, weight), ...], benchmark=name)` (weights sum to 1).
from bat_jax.benchmark.stages import StageSet

#: `SandboxState`: a task's starting workspace (`files`: path → bytes, `env`). `Receipt`: one tool call as the host
#: saw it (`tool`, `exit_code`, `stdout`, `reads`, `writes`: kernel-observed paths, `written_digest(path)`).
from bat_jax.sandbox.types import Receipt, SandboxState

#: `Action`: one teacher action (`thought`, `tool`: 'execute_code' or 'submit', `arguments`, `stage`).
from bat_jax.sandbox.tools import Action

#: `Conversation`: what a teacher is called with (`brief`, `focus`, `stages`, `turns`).
from bat_jax.staged_benchmark.episode import Conversation

#: `Rubric(items, {key: requirement}, stages)`, `RubricItem(id, stage, description, evidence keys, check)`,
#: `EvidenceRequirement(key, description, check, path)`: a task's contract; a check is `(Evidence) -> bool`.
#: `Evidence`: what a check receives: `files` (final workspace), `start_files`, `submitted`, `receipts`;
#: `json(path)` / `text(path)` (None when missing or malformed), `ok_receipts(tool)`,
#: `ran(reads, read_under, writes_under)`, `wrote(path, reads)` (the calls that left `path` with its final bytes).
from bat_jax.verify.rubric import Evidence, EvidenceRequirement, Rubric, RubricItem

#: `json_or_none(data, path, limits)`: the total JSON reader for `score_task` (None when missing or malformed).
from bat_jax.sandbox.readers import json_or_none

__all__ = ["Action", "BenchmarkError", "Conversation", "Evidence", "EvidenceRequirement", "Receipt", "Rubric",
           "RubricItem", "SandboxState", "StageSet", "StagedBenchmark", "Task", "json_or_none"]
