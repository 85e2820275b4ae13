"""What a benchmark author imports: `from bat_jax.staged_benchmark.api import StagedBenchmark, Evidence, ...`.

`StagedBenchmark`: the class to subclass (its docstring lists what to declare). `Task`: what the core reads of a
task (`task_id`, `track`, `brief`, `state()`). `SandboxState`: a task's starting workspace (`files`: path → bytes,
`env`). `StageSet`: the stages, `StageSet.of([(id, title, weight), ...], benchmark=name)`. `Rubric`,
`RubricItem`, `EvidenceRequirement`: a task's contract, `Rubric(items, {key: requirement}, stages)`; each check is
`(Evidence) -> bool`. `Evidence`: what a check receives after the episode — `files` (final workspace, path →
bytes), `start_files`, `submitted`, `receipts`, and `json(path)` / `text(path)` (None when missing or malformed),
`ok_receipts(tool)`, `ran(reads, read_under, writes_under)`, `wrote(path, reads)` (the calls that left `path` with
its final bytes). `Receipt`: one tool call as the host saw it — `tool`, `exit_code`, `stdout`, `reads`, `writes`
(kernel-observed paths), `written_digest(path)`. `Action`: one teacher action (`thought`, `tool`, `arguments`,
`stage`). `Conversation`: what a teacher is called with (`brief`, `focus`, `stages`, `turns`). `json_or_none`: the total JSON
reader `score_task` uses. `BenchmarkError`: what `StagedBenchmark.validate` raises, naming the benchmark and field.
"""

from bat_jax.benchmark.stages import StageSet
from bat_jax.sandbox.readers import json_or_none
from bat_jax.sandbox.tools import Action
from bat_jax.sandbox.types import Receipt, SandboxState
from bat_jax.staged_benchmark.contract import BenchmarkError, StagedBenchmark, Task
from bat_jax.staged_benchmark.episode import Conversation
from bat_jax.verify.rubric import Evidence, EvidenceRequirement, Rubric, RubricItem

__all__ = ["Action", "BenchmarkError", "Conversation", "Evidence", "EvidenceRequirement", "Receipt", "Rubric",
           "RubricItem", "SandboxState", "StageSet", "StagedBenchmark", "Task", "json_or_none"]
