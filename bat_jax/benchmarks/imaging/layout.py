"""Workspace layout of a task.

The workspace-relative paths a brief names, the fixed training and held-out layouts, and the seed-drawn training
layouts (paths and ids vary from task to task). A layout is public: `Layout.render` writes the '## Paths' lines
of a brief and `Layout.parse` reads them back.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np


@dataclasses.dataclass(frozen=True)
class Layout:
    """Workspace-relative paths of one task. Held-out tasks use a different layout than training tasks."""

    images_dir: str = "data/images"
    archive_dir: str = "data/archive"
    cases_csv: str = "data/cases.csv"
    method_dir: str = "method"
    outputs_dir: str = "outputs"
    plan_path: str = "plan.md"

    @property
    def pred_dir(self) -> str:
        return f"{self.outputs_dir}/pred"

    @property
    def validation_dir(self) -> str:
        return f"{self.outputs_dir}/validation"

    @property
    def validation_json(self) -> str:
        return f"{self.outputs_dir}/validation.json"

    @property
    def env_json(self) -> str:
        return f"{self.outputs_dir}/env.json"

    @property
    def submission(self) -> str:
        return f"{self.outputs_dir}/submission.json"

    def render(self) -> str:
        """The '## Paths' lines of a brief (`key: value`), parsed back by `Layout.parse`."""
        return "\n".join(f"- {f.name}: `{getattr(self, f.name)}`" for f in dataclasses.fields(self))

    @classmethod
    def parse(cls, brief: str) -> "Layout":
        """Reads the layout from a brief's path lines. Raises ValueError naming a missing key."""
        values = {}
        for f in dataclasses.fields(cls):
            m = re.search(rf"^- {f.name}: `([^`]+)`", brief, flags=re.MULTILINE)
            if not m:
                raise ValueError(f"brief has no path line for {f.name!r}")
            values[f.name] = m.group(1)
        return cls(**values)


TRAIN_LAYOUT = Layout()
HELDOUT_LAYOUT = Layout(images_dir="study/scans", archive_dir="study/backup", cases_csv="study/manifest.csv",
                        method_dir="tools/method", outputs_dir="results", plan_path="notes/plan.md")

# Name pools of seed-drawn training layouts (`varied_naming`). None holds a component of HELDOUT_LAYOUT, so no
# training path can spell a held-out one.
_ROOTS = ("data", "input", "raw", "cohort", "project", "work", "batch", "exam", "series", "site", "trial",
          "collection", "dataset", "intake", "share", "lab", "clinic", "ward", "source", "inbox")
_IMAGES = ("images", "imgs", "volumes", "slices", "frames", "cases", "files", "pixels", "acq", "img", "inputs",
           "raw_px", "pictures", "stack")
_ARCHIVES = ("archive", "bak", "orig", "originals", "mirror", "spare", "copies", "vault", "safe", "snapshots",
             "restore", "cold")
_TABLES = ("cases", "index", "list", "catalog", "table", "cohort", "registry", "inventory", "roster", "sheet",
           "worklist", "census")
_METHODS = ("method", "algo", "pipeline", "solver", "engine", "baseline", "code", "pkg", "lib", "src", "model_dir",
            "predictor")
_SUBDIRS = ("", "", "v1", "core", "impl", "current")
_OUTPUTS = ("outputs", "out", "output", "artifacts", "deliver", "export", "answers", "products", "final", "runs",
            "made", "yield")
_PLAN_DIRS = ("", "", "docs/", "doc/", "meta/", "admin/")
_PLANS = ("plan", "PLAN", "planning", "todo", "roadmap", "steps", "approach")
#: Two-letter id prefixes of seed-drawn training tasks: any but the held-out suite's 'hx'.
_LETTERS = "abcdefgijklmnopqrstuvwyz"


def varied_naming(seed: int) -> tuple[Layout, str]:
    """(layout, id prefix) of a training task drawn from its seed.

    Every path of the workspace (image, archive and method directories, the cases table, outputs and plan) and the
    two-letter prefix of its task and case ids come from name pools with numbered roots, so paths and ids differ from
    task to task and only reading the brief gives them. Pure function of `seed`; never a held-out component or the 'hx'
    prefix.
    """
    rng = np.random.default_rng([int(seed), 15])

    def pick(pool):
        return pool[int(rng.integers(len(pool)))]

    root = f"{pick(_ROOTS)}{pick(('', '_', '-'))}{int(rng.integers(1, 100))}"
    sub = pick(_SUBDIRS)
    method = pick(_METHODS) + (f"/{sub}" if sub else "")
    outputs = pick(_OUTPUTS) + pick(("", f"_{int(rng.integers(1, 100))}"))
    layout = Layout(images_dir=f"{root}/{pick(_IMAGES)}", archive_dir=f"{root}/{pick(_ARCHIVES)}",
                    cases_csv=f"{root}/{pick(_TABLES)}.csv", method_dir=method, outputs_dir=outputs,
                    plan_path=f"{pick(_PLAN_DIRS)}{pick(_PLANS)}.md")
    prefix = pick(_LETTERS) + pick(_LETTERS)
    return layout, prefix
