"""launch/bench as a package: the tiny default's settings are read from gin/bicurl_tiny.gin (not copied), no bench
module imports a sibling that imports it back, nothing in launch/ edits `sys.path`, and every script answers
`python -m launch.bench.<script> --help` from the repository root."""

import ast
import os
import pathlib
import subprocess
import sys

import gin
import pytest

from launch.bench import workloads

REPO = pathlib.Path(__file__).resolve().parents[1]
BENCH = REPO / "launch" / "bench"
#: Modules of launch/bench that are libraries of the scripts, not scripts themselves.
LIBRARIES = {"__init__", "workloads", "rollout_loops", "replica_loops"}
SCRIPTS = sorted(p.stem for p in BENCH.glob("*.py") if p.stem not in LIBRARIES)


def test_tiny_default_carries_the_gin_files_engine_agent_and_model_settings():
    tiny = workloads.tiny_default()
    assert (tiny.engine.kind, tiny.engine.max_batch, tiny.engine.prefix_cache_rows, tiny.engine.slots) == (
        "jax", 8, 64, 16)
    assert (tiny.agent.max_assistant_turns, tiny.agent.max_tokens_per_turn, tiny.agent.max_context_tokens,
            tiny.agent.max_generate_batch, tiny.agent.max_concurrent_generate, tiny.sampling.temperature) == (
        6, 832, 3072, 1, 64, 0.7)
    assert dict(tiny.policy.tiny) == {"hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 4,
                                      "max_position_embeddings": 8192, "chunk_size": 16}
    assert (tiny.memory.attention_block, tiny.sampling.group_size, tiny.block.optimizer.learning_rate) == (128, 4, 1e-4)


def test_tiny_default_follows_a_binding_and_leaves_gin_cleared():
    assert workloads.tiny_default(("engines.EngineConfig.slots = 4",)).engine.slots == 4
    assert workloads.tiny_default().engine.slots == 16
    with pytest.raises(ValueError):  # nothing of the tiny gin file stays bound in the process
        gin.query_parameter("engines.EngineConfig.slots")


def _bench_imports(path: pathlib.Path) -> set[str]:
    """Stems of the launch.bench modules `path` imports, anywhere in the file."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module == "launch.bench":
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("launch.bench."):
            out.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            out.update(a.name.split(".")[2] for a in node.names if a.name.startswith("launch.bench."))
    return out


def test_no_bench_module_imports_one_that_imports_it_back():
    graph = {p.stem: _bench_imports(p) for p in BENCH.glob("*.py")}
    assert graph["replica_loops"] == {"workloads", "compile_probe"}
    assert graph["rollout_loops"] == {"workloads", "replica_loops"}

    def reach(start):
        seen, todo = set(), [start]
        while todo:
            for nxt in graph.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    assert [m for m in graph if m in reach(m)] == []


def test_nothing_in_launch_edits_sys_path():
    offenders = []
    for path in sorted((REPO / "launch").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if (isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name)
                    and node.value.id == "sys"):
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert offenders == []


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_answers_help_as_a_module(script):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the repository root only
    out = subprocess.run([sys.executable, "-m", f"launch.bench.{script}", "--help"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith(f"usage: {script}.py"), out.stdout[:200]
