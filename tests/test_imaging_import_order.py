"""The imaging task framework's imports go one way: `base` → `brief` → `layout` (no circle).

Checked statically (every import statement of the module, at any depth, including `TYPE_CHECKING` blocks and
imports inside functions) and by importing each module first in a fresh interpreter.
"""

import ast
import pathlib
import subprocess
import sys

import pytest

IMAGING = pathlib.Path(__file__).resolve().parents[1] / "bat_jax" / "benchmarks" / "imaging"


def _imported_modules(path: pathlib.Path) -> set[str]:
    """Every module named by an import statement anywhere in `path` (`from a import b` gives a and a.b)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name}: relative import"
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


@pytest.mark.parametrize("module, forbidden", [
    ("brief", ("bat_jax.benchmarks.imaging.base",)),
    ("layout", ("bat_jax.benchmarks.imaging.base", "bat_jax.benchmarks.imaging.brief")),
])
def test_lower_modules_never_import_the_ones_above(module, forbidden):
    imported = _imported_modules(IMAGING / f"{module}.py")
    assert not imported & set(forbidden), f"benchmarks/imaging/{module}.py imports {sorted(imported & set(forbidden))}"


@pytest.mark.parametrize("order", [("base", "brief"), ("brief", "base"), ("layout", "brief", "base")])
def test_each_import_order_works_in_a_fresh_interpreter(order):
    code = "; ".join(f"import bat_jax.benchmarks.imaging.{m}" for m in order)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=IMAGING.parents[2])
    assert done.returncode == 0, done.stderr
