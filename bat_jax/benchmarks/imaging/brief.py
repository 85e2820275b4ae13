"""Public task text: the `task.md` brief (Lite-tier style) and the stage skills κ for S1–S5.

Details: docs/design.md.
"""

from __future__ import annotations

import re
from typing import Protocol

from bat_jax.benchmarks.imaging.stages import STAGES, Stage
from bat_jax.benchmarks.imaging.layout import Layout


class TrackText(Protocol):
    """What a brief says about a track (every `tasks.base.Track` has these; this module never imports it)."""

    name: str
    title: str
    output_summary: str
    metric_name: str
    method_summary: str

_OPENINGS = (
    "You are an imaging research assistant. Complete the {title} task below end to end.",
    "A study team needs the following {title} job done inside this workspace.",
    "Held-out assignment: carry out the {title} analysis described here and hand in the result.",
)
N_TEMPLATES = len(_OPENINGS)
HELDOUT_TEMPLATE = 2
#: Templates VARIED_TEMPLATE_BASE + w: training wording w (0 or 1) with seed-drawn paths and ids.
VARIED_TEMPLATE_BASE = 10
VARIED_TEMPLATES = tuple(VARIED_TEMPLATE_BASE + w for w in range(N_TEMPLATES) if w != HELDOUT_TEMPLATE)


def wording(template: int) -> int:
    """The opening wording (0..N_TEMPLATES-1) of a task template.

    Raises:
      ValueError: a template that is neither 0..N_TEMPLATES-1 nor one of `VARIED_TEMPLATES`.
    """
    if 0 <= template < N_TEMPLATES:
        return template
    if template in VARIED_TEMPLATES:
        return template - VARIED_TEMPLATE_BASE
    raise ValueError(f"template must be in 0..{N_TEMPLATES - 1} or one of {VARIED_TEMPLATES}, got {template}")


def render_brief(track: TrackText, task_id: str, layout: Layout, n_cases: int, template: int) -> str:
    """The `task.md` text of one task.

    Raises:
      ValueError: a template outside 0..N_TEMPLATES-1 and `VARIED_TEMPLATES` (`wording`).
    """
    opening = _OPENINGS[wording(template)].format(title=track.title)
    return f"""# Task {task_id}

{opening}

Task id: {task_id}
Track: {track.name}

## Goal
Produce a {track.output_summary} for each of the {n_cases} cases listed in the case manifest, scored by
{track.metric_name}.

## Paths
{layout.render()}

## Method
Use the provided method in `{layout.method_dir}/model.py` (configuration in `{layout.method_dir}/config.json`):
{track.method_summary}
Call it as `model.predict(model.load_input(path), row, model.load_config())` where `row` is the case's
manifest row (a dict), then `model.save_prediction(pred, "{layout.pred_dir}", case_id)`, which writes the
prediction files and returns the case's submission entry. `model.summarize(pred)` reports the output shape
and whether the output is non-degenerate.

## Workflow
1. Plan: read this brief and the case manifest; write a plan to `{layout.plan_path}`.
2. Setup: check the Python environment and the method; record versions in `{layout.env_json}`.
3. Validate: check every case input; run the method on one case into `{layout.validation_dir}`; write
   `{layout.validation_json}` with `case_id`, `output_shape`, `nondegenerate`, `entry` and `issues`
   (a list of {{"case_id", "kind": "missing"|"unreadable"|"spacing", "action": "restored"|"repaired"|
   "unrecoverable"}}). Restore inputs from `{layout.archive_dir}` when a copy exists; when the manifest
   has a `spacing_mm` column, a NIfTI header whose voxel size differs from it must be repaired.
4. Inference: run the method on every usable case into `{layout.pred_dir}`.
5. Submit: write `{layout.submission}` as
   {{"task_id": "{task_id}", "predictions": {{case_id: entry}}, "failed": {{case_id: reason}}}}
   and call the submit tool with that path. Cases that cannot be done go to "failed" with a reason.
"""


_SKILLS = {
    Stage.PLAN: """Stage S1 Plan.
Goal: understand the task before touching data.
Do: read task.md; read the case manifest and count the cases; look at the method directory; write the plan
file naming the method, the number of cases and the submission path.
Checks: every case in the manifest is accounted for; the plan names the output schema.
Recovery: if a path in the brief does not exist, list the workspace and note the discrepancy in the plan.""",
    Stage.SETUP: """Stage S2 Setup.
Goal: make sure the tools work before running them.
Do: import numpy (and nibabel/PIL as needed) and the provided method; load its config and print its version;
create the output directories; record the Python, numpy and method versions in the env file.
Checks: the import succeeded (exit code 0); the recorded method version equals the config's version.
Recovery: on an import error, read the traceback, fix the path (sys.path) and retry.""",
    Stage.VALIDATE: """Stage S3 Validate.
Goal: prove the pipeline works on a small case and find bad inputs before full inference.
Do: check that every case input exists and loads, and that NIfTI header voxel sizes match the manifest's
spacing_mm when present; restore a missing or unreadable input from the archive directory if a copy exists,
rewrite a wrong header spacing from the manifest (re-check both); run the method on one good case; check
the output shape and that the output is non-degenerate; write the validation report with every issue found.
Checks: a real execution of the method happened; shape and non-degeneracy were checked; each issue names
the case, its kind (missing | unreadable | spacing) and the action taken (restored | repaired |
unrecoverable).
Recovery: an input with no archive copy is unrecoverable — record it, do not invent an output.""",
    Stage.INFERENCE: """Stage S4 Inference.
Goal: produce outputs for every usable case.
Do: read the validation report; run the method on every case not marked unrecoverable; save each with
save_prediction; print a per-case status.
Checks: every usable case has a prediction file; no output was written for an unrecoverable case.
Recovery: if a case fails, read the error, fix the input if possible, and rerun only that case.""",
    Stage.SUBMIT: """Stage S5 Submit.
Goal: hand in a complete, schema-valid result.
Do: collect the saved entries into the submission file with the task id; list unrecoverable cases under
"failed" with a reason; check that every case is either predicted or failed; call submit with the path.
Checks: the file parses as JSON; the task id matches; coverage is complete; the submit call succeeded.
Recovery: if the check fails, fix the file and check again before submitting.""",
}


def stage_skill(stage: str) -> str:
    """The public stage skill κ of a stage (goal, checks, recovery steps)."""
    return _SKILLS[STAGES.parse(stage)]


#: One line per stage skill: what the compact prompt keeps of κ (goal and the files the stage leaves behind).
_COMPACT_SKILLS = {
    Stage.PLAN: "S1 Plan: cat task.md; read the cases file; write the plan (method, case count, submission).",
    Stage.SETUP: "S2 Setup: import the method, print its config version; make the output dirs; write the env file.",
    Stage.VALIDATE: "S3 Validate: check every input (restore from archive, fix spacing); smoke-run one case; "
                    "write the validation report.",
    Stage.INFERENCE: "S4 Inference: run the method on every usable case; save each prediction.",
    Stage.SUBMIT: "S5 Submit: write the submission (task id, predictions, failed) and submit it.",
}
SKILL_HEADING = "\n\n## Stage skill\n"


def compact_skill(stage: str) -> str:
    """The one-line form of a stage skill κ (compact prompting)."""
    return _COMPACT_SKILLS[STAGES.parse(stage)]


def compact_user_message(text: str) -> str:
    """The terse form of a full first user turn; pure and deterministic.

    The turn is `brief` + `SKILL_HEADING` + stage skills, the layout `render_brief` / `stage_skill` / the Stage Bank's
    row prompts write. The terse form holds the task id, track, case count, every workspace path the workflow touches,
    the submission schema, the stage a stage row starts at, the E2E budget, and one line per stage skill present.

    Text that is not such a turn (no `Task id:` / `Track:` lines or path lines) is returned unchanged, so an
    external benchmark's brief is never mangled.
    """
    head, _, skills = text.partition(SKILL_HEADING)
    task_id = re.search(r"^Task id: (\S+)", head, flags=re.MULTILINE)
    track = re.search(r"^Track: (\S+)", head, flags=re.MULTILINE)
    n_cases = re.search(r"each of the (\d+) cases", head)
    try:
        layout = Layout.parse(head)
    except ValueError:
        return text
    if not (task_id and track and n_cases):
        return text
    tid, L = task_id.group(1), layout
    lines = [f"Task {tid} | {track.group(1)} | {n_cases.group(1)} cases",
             f"cases: {L.cases_csv}", f"images: {L.images_dir}", f"archive: {L.archive_dir}",
             f"method: {L.method_dir}/model.py", f"plan: {L.plan_path}", f"env: {L.env_json}",
             f"validation: {L.validation_json} (smoke run into {L.validation_dir})", f"predictions: {L.pred_dir}",
             f'submission: {L.submission} = {{"task_id": "{tid}", "predictions": {{case_id: entry}}, '
             f'"failed": {{case_id: reason}}}}']
    start = re.search(r"boundary of stage (S\d) (\w+)\. Stages already completed in this workspace: ([^.]*)\.", head)
    if start:
        lines.append(f"Start: {start.group(1)} {start.group(2)} (done: {start.group(3)}); do {start.group(1)} only, "
                     f"then stop.")
    budget = re.search(r"at most (\d+) validation pass", head)
    if budget:
        lines.append(f"Budget: at most {budget.group(1)} validation pass(es).")
    stages = re.findall(r"^Stage (S\d) ", skills, flags=re.MULTILINE)
    if stages:
        lines += ["Skills:"] + [compact_skill(s) for s in stages]
    return "\n".join(lines)

