"""The portable scripted expert: one fixed action text per workflow step, whatever the task.

Details: docs/design.md.
"""

from __future__ import annotations

import textwrap

from bat_jax.benchmarks.imaging.stages import STAGES, Stage
from bat_jax.sandbox.tools import Action
from bat_jax.sandbox.types import Observation
from bat_jax.staged_benchmark.episode import Conversation
from bat_jax.benchmarks.imaging.teacher import _last_json

#: Version of the action texts (the Stage Bank recipe names it): v2 = each step prints the next step's name first
#: and the thought repeats it.
VERSION = "v2"

#: Reads the brief when the code runs: B = its text, P = its '## Paths' lines (`Layout.render`), O = outputs
#: dir, rows = the case manifest; the method dir goes on sys.path. Every action ends with it (`_action`).
PREAMBLE = """import csv, json, os, re, sys
B = open("task.md").read()
P = dict(re.findall(r"- (\\w+): `([^`]+)`", B))
O = P["outputs_dir"]
sys.path.insert(0, P["method_dir"])
rows = list(csv.DictReader(open(P["cases_csv"])))
"""


def _action(body: str) -> str:
    """An action's code: the stage's own `body` first, as `run()`, then the shared `PREAMBLE` and the call.

    The text every action shares comes after the stage's own text, so a policy writing an action decides its
    stage at the thought (`THOUGHTS`, read off the previous observation's `NEXT` line) and the body's first
    line right after it, and never has to carry that decision across shared text.
    """
    return "def run():\n" + textwrap.indent(body, "    ") + "\n\n" + PREAMBLE + "run()\n"


def _name(stage: str) -> str:
    return STAGES.label(stage)


#: The first line each stage's code prints, before anything that can fail: the step after it. The next
#: thought repeats it (`THOUGHTS`), so a policy reads which step comes next from the latest observation, right
#: before it writes that step, instead of inferring it from the whole history.
NEXT = {**{s: f"next: {_name(n)}" for s, n in zip(STAGES.ids, STAGES.ids[1:])}, Stage.SUBMIT: "next: submit"}
#: The thought of each step's action: the step named by the previous observation's `NEXT` line (S1: the first).
THOUGHTS = {s: f"Next: {_name(s)}." for s in STAGES.ids}


def _stage_action(stage: str, summary: str, body: str) -> str:
    """`_action` of a body that opens with the comment naming its stage and `summary`.

    That comment is the one place where the action texts of two stages differ first. The print of the step that follows
    it (`NEXT`) follows the body."""
    return _action(f"# {_name(stage)}: {summary}\nprint({NEXT[stage]!r})\n{body}")


_PLAN = _stage_action(Stage.PLAN, "read the brief and the case manifest; write the plan.", """\
T, M, n = re.search(r"Task id: (\\S+)", B).group(1), P["method_dir"], len(rows)
print(T, json.dumps([r["case_id"] for r in rows]), n, "cases")
os.makedirs(os.path.dirname(P["plan_path"]) or ".", exist_ok=True)
open(P["plan_path"], "w").write(f"# Plan for {T}\\n{n} cases in {P['cases_csv']}; method {M}/model.py; "
                                f"restore from {P['archive_dir']}; submission {O}/submission.json\\n")
""")

_SETUP = _stage_action(Stage.SETUP, "import the method, record versions, create the output directories.", """\
import numpy, model
info = {"numpy": numpy.__version__, "method_version": model.load_config()["version"]}
for d in ("", "/pred", "/validation"):
    os.makedirs(O + d, exist_ok=True)
json.dump(info, open(O + "/env.json", "w"))
print(info)
""")

_VALIDATE = _stage_action(
    Stage.VALIDATE, "check every input, restore or repair, smoke-run one case, write the report.", """\
import gzip, model, numpy as np
A = P["archive_dir"]

def check(r):
    if not os.path.exists(r["file"]):
        return "missing"
    try:
        model.load_input(r["file"])
    except Exception:
        return "unreadable"
    if r.get("spacing_mm") and r["file"].endswith(".nii.gz"):
        import nibabel as nib
        zooms = [float(z) for z in nib.load(r["file"]).header.get_zooms()[:3]]
        if zooms != [float(v) for v in r["spacing_mm"].split(",")]:
            return "spacing"
    return "ok"

issues, good = [], []
for r in rows:
    kind, f, a = check(r), r["file"], os.path.join(A, os.path.basename(r["file"]) + ".gz")
    if kind == "ok":
        good.append(r)
        continue
    if kind == "spacing":
        import nibabel as nib
        z = [float(v) for v in r["spacing_mm"].split(",")]
        nib.save(nib.Nifti1Image(np.asarray(nib.load(f).dataobj), np.diag(z + [1.0] * (4 - len(z)))), f)
    elif os.path.exists(a):
        open(f, "wb").write(gzip.decompress(open(a, "rb").read()))
    fixed = check(r) == "ok"
    issues.append({"case_id": r["case_id"], "kind": kind,
                   "action": ("repaired" if kind == "spacing" else "restored") if fixed else "unrecoverable"})
r = (good or rows)[0]
pred = model.predict(model.load_input(r["file"]), r, model.load_config())
entry, s = model.save_prediction(pred, O + "/validation", r["case_id"]), model.summarize(pred)
json.dump({"case_id": r["case_id"], "output_shape": s["shape"], "nondegenerate": s["nondegenerate"],
           "entry": entry, "issues": issues}, open(O + "/validation.json", "w"))
print(issues, s)
""")

_INFERENCE = _stage_action(Stage.INFERENCE, "run the method on every usable case.", """import model
issues = json.load(open(O + "/validation.json")).get("issues", [])
skip = [i["case_id"] for i in issues if i["action"] == "unrecoverable"]
for r in rows:
    if r["case_id"] not in skip:
        model.save_prediction(model.predict(model.load_input(r["file"]), r, model.load_config()), O + "/pred",
                              r["case_id"])
print("predicted", len(rows) - len(skip), "skipped", skip)
""")

_SUBMIT = _stage_action(Stage.SUBMIT, "assemble the submission and check coverage.", """\
T, D, S = re.search(r"Task id: (\\S+)", B).group(1), O + "/pred", O + "/submission.json"
preds = {n[:-5]: json.load(open(D + "/" + n)) for n in os.listdir(D) if n.endswith(".json")}
issues = json.load(open(O + "/validation.json")).get("issues", [])
failed = {i["case_id"]: i["kind"] + " input, unrecoverable" for i in issues if i["action"] == "unrecoverable"}
failed.update({r["case_id"]: "no prediction" for r in rows if r["case_id"] not in preds and r["case_id"] not in failed})
json.dump({"task_id": T, "predictions": preds, "failed": failed}, open(S, "w"))
print(json.dumps({"complete": len(preds) + len(failed) == len(rows), "submission": S}))
""")

#: (stage, thought, code) of every python action, in order; the submit call follows S5's.
SCRIPT: tuple[tuple[str, str, str], ...] = tuple(
    (stage, THOUGHTS[stage], code) for stage, code in zip(STAGES.ids, (_PLAN, _SETUP, _VALIDATE, _INFERENCE, _SUBMIT)))
SUBMIT_THOUGHT = "Next: submit."


class PortableExpert:
    """Scripted expert whose actions are the same text for every task (fresh instance per episode).

    Plays the stages of `Conversation.stages` in order with the actions of `SCRIPT`, then submits the path its
    S5 action printed when that action reports complete coverage; returns None (stop) after that.
    """

    def __init__(self):
        self._gen = None

    def __call__(self, conv: Conversation) -> Action | None:
        try:
            if self._gen is None:
                self._gen = self._script(conv)
                return next(self._gen)
            return self._gen.send(conv.turns[-1].observation)
        except StopIteration:
            return None

    def _script(self, conv: Conversation):
        obs: Observation | None = None
        for stage in conv.stages:
            for step_stage, thought, code in SCRIPT:
                if step_stage == stage:
                    obs = yield Action(thought, "execute_code", {"language": "python", "code": code}, stage)
            if stage == Stage.SUBMIT and obs is not None:
                result = _last_json(obs)
                if result.get("complete") and isinstance(result.get("submission"), str):
                    yield Action(SUBMIT_THOUGHT, "submit", {"path": result["submission"]}, stage)
