"""The public names for benchmark authors (bat_jax/staged_benchmark/api.py): each is the core's own object, each is
documented in a one-line comment, and the example benchmark outside the package needs no other bat_jax import."""

import ast
import pathlib

from bat_jax.staged_benchmark import api

FIXTURE = pathlib.Path(__file__).resolve().parent / "fixtures" / "wordcount" / "wordcount.py"


def test_the_names_are_the_cores_objects_not_copies():
    from bat_jax.benchmark.stages import StageSet
    from bat_jax.sandbox.tools import Action
    from bat_jax.sandbox.types import Receipt, SandboxState
    from bat_jax.staged_benchmark.contract import StagedBenchmark
    from bat_jax.verify.rubric import Evidence, Rubric, RubricItem

    assert (api.StageSet, api.Action, api.Receipt, api.SandboxState, api.StagedBenchmark, api.Evidence, api.Rubric,
            api.RubricItem) == (StageSet, Action, Receipt, SandboxState, StagedBenchmark, Evidence, Rubric, RubricItem)
    assert sorted(api.__all__) == ["Action", "BenchmarkError", "Conversation", "Evidence", "EvidenceRequirement",
                                   "Receipt", "Rubric", "RubricItem", "SandboxState", "StageSet", "StagedBenchmark",
                                   "Task", "json_or_none"]


def test_every_name_and_every_evidence_accessor_is_documented_in_one_line_comments():
    comments = "\n".join(line for line in pathlib.Path(api.__file__).read_text().splitlines() if line.startswith("#:"))
    assert all(f"`{name}" in comments for name in api.__all__)
    for accessor in ("files", "start_files", "submitted", "receipts", "json(path)", "text(path)", "ok_receipts(tool)",
                     "ran(reads, read_under, writes_under)", "wrote(path, reads)", "reads", "writes",
                     "written_digest(path)"):
        assert f"`{accessor}`" in comments, accessor
    words = len(api.__doc__.split())
    assert words <= 60, words  # a module docstring: a summary and one short paragraph
    evidence = api.Evidence((), {"a.json": b'{"n": 1}'})
    assert (evidence.json("a.json"), evidence.json("b.json"), evidence.text("a.json")) == ({"n": 1}, None, '{"n": 1}')


def test_the_example_benchmark_imports_only_the_public_names():
    tree = ast.parse(FIXTURE.read_text())
    modules = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert {m for m in modules if m.startswith("bat_jax")} == {"bat_jax.staged_benchmark.api"}
