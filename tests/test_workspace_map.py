"""WORKSPACE.md's map of the code names every module of the package (and names no module that is gone)."""

import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_every_module_is_in_the_map_and_every_mapped_module_exists():
    text = (REPO / "WORKSPACE.md").read_text()
    modules = {str(p.relative_to(REPO)) for p in (REPO / "bat_jax").rglob("*.py")
               if p.name != "__init__.py" or p.parent.name == "launch"}
    mapped = set(re.findall(r"`(bat_jax/[\w/]+\.py)`", text))
    assert sorted(modules - mapped) == [], "modules missing from WORKSPACE.md"
    assert sorted(mapped - modules) == [], "WORKSPACE.md names modules that do not exist"
