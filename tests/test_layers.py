"""Imports point down the layers (WORKSPACE.md's map, DESIGN.md): every `bat_jax` module's imports — at top level,
inside functions and under `TYPE_CHECKING` alike — are read with `ast` and checked against one declared order of
units (a top-level package or module of `bat_jax`). A module may import its own unit or a unit below it; an import
of a higher unit fails the test naming the file, line and both units. No import cycle between files, and none
between units."""

import ast
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = REPO / "bat_jax"

#: The layers, bottom first; inside a layer the units are in order too (a unit may import the units before it).
LAYERS = (
    ("ground", ("bat_jax", "bat_jax.atomic_io", "bat_jax.errors", "bat_jax.benchmark", "bat_jax.clients",
                "bat_jax.sandbox", "bat_jax.checkpoint", "bat_jax.ledger", "bat_jax.report",
                "bat_jax.sweep_report")),
    ("mechanisms", ("bat_jax.verify", "bat_jax.staged_benchmark", "bat_jax.models", "bat_jax.rollout",
                    "bat_jax.learn", "bat_jax.stage_bank", "bat_jax.curriculum", "bat_jax.prompts", "bat_jax.policy")),
    ("benchmarks", ("bat_jax.benchmarks", "bat_jax.benchmarks.imaging", "bat_jax.benchmarks.tabular")),
    ("composition", ("bat_jax.bicurl",)),
    ("edge", ("bat_jax.launch",)),
)
UNITS = [unit for _, units in LAYERS for unit in units]
#: The staged benchmarks (plug-ins, `bat_jax/benchmarks/<name>/`): nothing outside a benchmark's own unit imports it,
#: and no benchmark another.
BENCHMARK_UNITS = tuple(u for u in dict(LAYERS)["benchmarks"] if u.startswith("bat_jax.benchmarks."))
RANK = {unit: i for i, unit in enumerate(UNITS)}
LAYER_OF = {unit: layer for layer, units in LAYERS for unit in units}


def _modules() -> dict[str, pathlib.Path]:
    """Dotted module name → file, for every .py file of the package."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The module a dotted import name lands in: the longest prefix that is a module of the package."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str) -> list[tuple[str, int]]:
    """(imported bat_jax module, line) of every import statement in `module`'s file, wherever it stands."""
    path = MODULES[module]
    is_package = path.name == "__init__.py"
    found = []
    for node in ast.walk(ast.parse(path.read_text("utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            names = [f"{stem}.{alias.name}" for alias in node.names]  # `from pkg import module` names a module
        else:
            continue
        for name in names:
            if name == "bat_jax" or name.startswith("bat_jax."):
                target = _resolve(name)
                if target is not None and target != module:
                    found.append((target, node.lineno))
    return found


def unit_of(module: str) -> str:
    """The declared unit a module belongs to (its top-level package or module under `bat_jax`; a benchmark's package
    under `bat_jax/benchmarks/`)."""
    parts = module.split(".")
    unit = ".".join(parts[:3] if parts[1:2] == ["benchmarks"] else parts[:2])
    if unit not in RANK:
        raise AssertionError(f"{MODULES[module].relative_to(REPO)}: unit {unit} is in no layer of tests/test_layers.py")
    return unit


GRAPH = {m: sorted({t for t, _ in imports_of(m)}) for m in MODULES}


def _cycle(graph: dict[str, list[str]]) -> list[str] | None:
    """One cycle of `graph` as a path whose first and last node are the same, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in graph.get(node, ()):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_every_unit_of_the_package_is_in_a_layer():
    units = {unit_of(m) for m in MODULES}
    assert sorted(set(UNITS) - units) == [], "layers name units that do not exist"


def test_no_import_climbs_to_a_higher_unit():
    climbing = []
    for module in MODULES:
        mine = unit_of(module)
        for target, line in imports_of(module):
            theirs = unit_of(target)
            if RANK[theirs] > RANK[mine]:
                climbing.append(f"{MODULES[module].relative_to(REPO)}:{line} imports {target} "
                                f"({LAYER_OF[mine]} {mine} -> {LAYER_OF[theirs]} {theirs})")
    assert climbing == [], "imports that climb the layers:\n" + "\n".join(climbing)


def test_no_file_cycle():
    assert _cycle(GRAPH) is None, " -> ".join(_cycle(GRAPH))


def test_no_unit_cycle():
    units: dict[str, set[str]] = {}
    for module, targets in GRAPH.items():
        units.setdefault(unit_of(module), set()).update(unit_of(t) for t in targets if unit_of(t) != unit_of(module))
    graph = {u: sorted(t) for u, t in units.items()}
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


@pytest.mark.parametrize("source, expected", [
    ("from bat_jax.benchmarks.imaging import registry\n", ["bat_jax.benchmarks.imaging.registry"]),
    ("def f():\n    import bat_jax.policy as p\n", ["bat_jax.policy"]),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from bat_jax.ledger import Ledger\n", ["bat_jax.ledger"]),
    ("from .stages import STAGES\n", ["bat_jax.benchmark.stages"]),
    ("from . import stages\n", ["bat_jax.benchmark.stages"]),
])
def test_the_reader_finds_every_kind_of_import(tmp_path, monkeypatch, source, expected):
    """The reader sees function-level, TYPE_CHECKING and relative imports (a module placed in benchmark/)."""
    monkeypatch.setitem(MODULES, "bat_jax.benchmark._layers_probe", tmp_path / "_layers_probe.py")
    (tmp_path / "_layers_probe.py").write_text(source)
    assert [t for t, _ in imports_of("bat_jax.benchmark._layers_probe")] == expected


def test_a_cycle_is_found():
    assert _cycle({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == ["a", "b", "c", "a"]
    assert _cycle({"a": ["b"], "b": [], "c": ["a", "b"]}) is None


def test_the_core_never_imports_a_benchmark():
    """A run names its benchmark in gin; no module of the core, composition or launch imports one, and no
    benchmark imports another."""
    offenders = []
    for module in MODULES:
        mine = unit_of(module)
        for target, line in imports_of(module):
            theirs = unit_of(target)
            if theirs in BENCHMARK_UNITS and theirs != mine:
                offenders.append(f"{MODULES[module].relative_to(REPO)}:{line} imports {target}")
    assert offenders == [], "imports of a benchmark outside it:\n" + "\n".join(offenders)


def _string_constants(path: pathlib.Path) -> list[tuple[str, int]]:
    """(value, line) of every string constant of a file that is not a docstring."""
    tree = ast.parse(path.read_text("utf-8"), str(path))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return [(node.value, node.lineno) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def test_no_stage_is_named_in_the_core():
    """The core reads stages from the run's benchmark: no string constant outside a benchmark is one of the imaging
    suite's stage ids or titles (f-string parts included)."""
    import re

    named = re.compile(r"\b(S[1-9]|Plan|Setup|Validate|Inference|Submit)\b")
    found = []
    for module, path in MODULES.items():
        if unit_of(module) in BENCHMARK_UNITS:
            continue
        for value, line in _string_constants(path):
            if named.fullmatch(value.strip()) or re.fullmatch(r"S[1-9]", value.strip()):
                found.append(f"{path.relative_to(REPO)}:{line} {value!r}")
    assert found == [], "stage ids or titles named in the core:\n" + "\n".join(found)
