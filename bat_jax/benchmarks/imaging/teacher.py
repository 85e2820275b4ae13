"""Teachers: the scripted expert (any track), the LLM teacher over a chat endpoint (`ChatTeacher`) and baselines.

Details: docs/design.md.
"""

from __future__ import annotations

import json
import random
import re
import time

from bat_jax.benchmarks.imaging.stages import STAGES, Stage
from bat_jax.clients.chat_endpoint import ChatClient, ChatEndpointConfig, ChatError
from bat_jax.sandbox.tools import Action
from bat_jax.sandbox.types import Observation
from bat_jax.staged_benchmark.episode import Conversation, PolicyError
from bat_jax.benchmarks.imaging.layout import Layout

def _last_json(obs: Observation) -> dict:
    """The last stdout line that parses as a JSON object ({} if none)."""
    for line in reversed(obs.stdout.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    return {}


def _py(stage: str, thought: str, code: str) -> Action:
    return Action(thought, "execute_code", {"language": "python", "code": code}, stage)


class ScriptedExpert:
    """Scripted expert policy for every track (fresh instance per episode).

    Args:
      diagnose: when False the Validate input check and restoration are skipped (an ablation: this teacher
        loses Validate credit on recovery variants, `tests/test_imaging_framework.py`).
    """

    def __init__(self, diagnose: bool = True):
        self.diagnose = diagnose
        self._gen = None

    def __call__(self, conv: Conversation) -> Action | None:
        try:
            if self._gen is None:
                self._gen = self._script(conv)
                action = next(self._gen)
            else:
                action = self._gen.send(conv.turns[-1].observation)
        except StopIteration:
            return None
        return action

    # ------------------------------------------------------------------------------------------------
    def _script(self, conv: Conversation):
        self.L = Layout.parse(conv.brief)
        m = re.search(r"^Task id: (\S+)", conv.brief, flags=re.MULTILINE)
        self.task_id = m.group(1) if m else ""
        steps = {Stage.PLAN: self._plan, Stage.SETUP: self._setup, Stage.VALIDATE: self._validate,
                 Stage.INFERENCE: self._inference, Stage.SUBMIT: self._submit}
        for stage in conv.stages:
            yield from steps[stage](stage)

    def _head(self) -> str:
        return (f"import csv, json, os, sys\nsys.path.insert(0, {self.L.method_dir!r})\n"
                f"CASES = {self.L.cases_csv!r}\n")

    def _plan(self, s: str):
        L = self.L
        yield Action("Read the brief first.", "execute_code", {"language": "bash", "code": "cat task.md"}, s)
        obs = yield _py(s, "Inventory the case manifest, the method and any archive.", f"""{self._head()}
rows = list(csv.DictReader(open(CASES)))
print(json.dumps({{"cases": [r["case_id"] for r in rows], "n": len(rows)}}))
print("method:", sorted(os.listdir({L.method_dir!r})))
print("archive:", sorted(os.listdir({L.archive_dir!r})) if os.path.isdir({L.archive_dir!r}) else [])
""")
        n = int(_last_json(obs).get("n", 0))
        plan = (f"# Plan for {self.task_id}\n\n{n} cases listed in {L.cases_csv}.\n"
                f"1. Setup: import numpy and {L.method_dir}/model.py, record versions in {L.env_json}.\n"
                f"2. Validate: check every input, restore from {L.archive_dir} if needed, smoke-run one case.\n"
                f"3. Inference: run {L.method_dir}/model.py on every usable case into {L.pred_dir}.\n"
                f"4. Submit: write {L.submission} and submit it.\n")
        yield _py(s, "Write the plan.", f"""import os
os.makedirs(os.path.dirname({L.plan_path!r}) or ".", exist_ok=True)
open({L.plan_path!r}, "w").write({plan!r})
print("plan written")
""")

    def _setup(self, s: str):
        L = self.L
        obs = yield _py(s, "Check the environment and load the method config.", f"""{self._head()}
import numpy, scipy
import model
cfg = model.load_config()
print(json.dumps({{"numpy": numpy.__version__, "python": sys.version.split()[0], "method_version": cfg["version"]}}))
""")
        info = _last_json(obs)
        yield _py(s, "Create output directories and record the versions I observed.", f"""import json, os
for d in ({L.outputs_dir!r}, {L.pred_dir!r}, {L.validation_dir!r}):
    os.makedirs(d, exist_ok=True)
json.dump({info!r}, open({L.env_json!r}, "w"))
print("env recorded")
""")

    def _validate(self, s: str):
        L = self.L
        issues = []
        if self.diagnose:
            obs = yield _py(s, "Check that every case input exists and loads.", f"""{self._head()}
import model
status = {{}}
for r in csv.DictReader(open(CASES)):
    if not os.path.exists(r["file"]):
        status[r["case_id"]] = ["missing", r["file"]]
        continue
    try:
        model.load_input(r["file"])
        kind = "ok"
        if r.get("spacing_mm") and r["file"].endswith(".nii.gz"):
            import nibabel as nib
            zooms = [float(z) for z in nib.load(r["file"]).header.get_zooms()[:3]]
            if zooms != [float(v) for v in r["spacing_mm"].split(",")]:
                kind = "spacing"
        status[r["case_id"]] = [kind, r["file"]]
    except Exception as e:
        status[r["case_id"]] = ["unreadable", r["file"]]
arch = sorted(os.listdir({L.archive_dir!r})) if os.path.isdir({L.archive_dir!r}) else []
print(json.dumps({{"status": status, "archive": arch}}))
""")
            info = _last_json(obs)
            bad = {cid: v for cid, v in info.get("status", {}).items() if v[0] != "ok"}
            archive = set(info.get("archive", []))
            todo = {cid: f for cid, (kind, f) in bad.items()
                    if kind != "spacing" and f.rsplit("/", 1)[-1] + ".gz" in archive}
            respace = sorted(cid for cid, (kind, _) in bad.items() if kind == "spacing")
            restored, repaired = set(), set()
            if respace:
                obs = yield _py(s, f"Rewrite the header spacing of {respace} from the manifest and re-check.",
                                f"""{self._head()}
import nibabel as nib, numpy as np
rows = {{r["case_id"]: r for r in csv.DictReader(open(CASES))}}
done = []
for cid in {respace!r}:
    f, want = rows[cid]["file"], [float(v) for v in rows[cid]["spacing_mm"].split(",")]
    img = nib.load(f)
    fixed = nib.Nifti1Image(np.asarray(img.dataobj), np.diag(want + [1.0] * (4 - len(want))))
    nib.save(fixed, f + ".tmp.nii.gz")
    os.replace(f + ".tmp.nii.gz", f)
    if [float(z) for z in nib.load(f).header.get_zooms()[:3]] == want:
        done.append(cid)
print(json.dumps({{"repaired": done}}))
""")
                repaired = set(_last_json(obs).get("repaired", []))
            if todo:
                obs = yield _py(s, f"Restore {sorted(todo)} from the archive and re-check them.", f"""{self._head()}
import gzip, model
todo = {json.dumps(todo)}
ok = []
for cid, f in todo.items():
    data = gzip.decompress(open(os.path.join({L.archive_dir!r}, os.path.basename(f) + ".gz"), "rb").read())
    os.makedirs(os.path.dirname(f), exist_ok=True)
    open(f, "wb").write(data)
    model.load_input(f)
    ok.append(cid)
print(json.dumps({{"restored": ok}}))
""")
                restored = set(_last_json(obs).get("restored", []))
            issues = [{"case_id": cid, "kind": kind,
                       "action": "restored" if cid in restored else "repaired" if cid in repaired
                       else "unrecoverable"} for cid, (kind, _) in sorted(bad.items())]
            good = [cid for cid, v in info.get("status", {}).items() if v[0] == "ok"]
        else:
            good = []
        pick = f"{good[0]!r}" if good else "next(csv.DictReader(open(CASES)))['case_id']"
        obs = yield _py(s, "Smoke-run the method on one good case and check shape and non-degeneracy.",
                        f"""{self._head()}
import model
rows = {{r["case_id"]: r for r in csv.DictReader(open(CASES))}}
cid = {pick}
pred = model.predict(model.load_input(rows[cid]["file"]), rows[cid], model.load_config())
entry = model.save_prediction(pred, {L.validation_dir!r}, cid)
print(json.dumps({{"case_id": cid, "entry": entry, **model.summarize(pred)}}))
""")
        smoke = _last_json(obs)
        report = {"case_id": smoke.get("case_id"), "output_shape": smoke.get("shape"),
                  "nondegenerate": smoke.get("nondegenerate"), "entry": smoke.get("entry"), "issues": issues}
        yield _py(s, "Write the validation report from what I observed.", f"""import json
json.dump({report!r}, open({L.validation_json!r}, "w"), indent=1)
print("validation report written")
""")

    def _inference(self, s: str):
        L = self.L
        obs = yield Action("Read the validation report to know which cases to skip.", "execute_code",
                           {"language": "bash", "code": f"cat {L.validation_json}"}, s)
        try:
            report = json.loads(obs.stdout)
        except json.JSONDecodeError:
            report = {}
        skip = sorted(i["case_id"] for i in report.get("issues", []) if i.get("action") == "unrecoverable")
        yield _py(s, f"Run the method on every usable case (skipping {skip}).", f"""{self._head()}
import model
cfg, skip = model.load_config(), set({skip!r})
done, errors = [], {{}}
for row in csv.DictReader(open(CASES)):
    cid = row["case_id"]
    if cid in skip:
        continue
    try:
        pred = model.predict(model.load_input(row["file"]), row, cfg)
        model.save_prediction(pred, {L.pred_dir!r}, cid)
        done.append(cid)
    except Exception as e:
        errors[cid] = type(e).__name__ + ": " + str(e)
print(json.dumps({{"done": done, "errors": errors}}))
""")

    def _submit(self, s: str):
        L = self.L
        obs = yield _py(s, "Assemble the submission and check coverage.", f"""{self._head()}
val = json.load(open({L.validation_json!r})) if os.path.exists({L.validation_json!r}) else {{"issues": []}}
preds = {{}}
if os.path.isdir({L.pred_dir!r}):
    for name in sorted(os.listdir({L.pred_dir!r})):
        if name.endswith(".json"):
            preds[name[:-5]] = json.load(open(os.path.join({L.pred_dir!r}, name)))
failed = {{i["case_id"]: i["kind"] + " input, " + i["action"] for i in val.get("issues", [])
          if i.get("action") == "unrecoverable"}}
ids = [r["case_id"] for r in csv.DictReader(open(CASES))]
for cid in ids:
    if cid not in preds and cid not in failed:
        failed[cid] = "no prediction produced"
json.dump({{"task_id": {self.task_id!r}, "predictions": preds, "failed": failed}}, open({L.submission!r}, "w"))
print(json.dumps({{"n_pred": len(preds), "n_failed": len(failed), "complete": set(preds) | set(failed) == set(ids)}}))
""")
        if _last_json(obs).get("complete"):
            yield Action("Coverage is complete; submit.", "submit", {"path": L.submission}, s)


# ---------------------------------------------------------------------------------------------------------
class DoNothingPolicy:
    """Baseline: stops immediately."""

    def __call__(self, conv: Conversation) -> Action | None:
        return None


_RANDOM_COMMANDS = ("ls", "pwd", "echo hello", "date", "ls -la /", "python3 -c 'print(1+1)'", "whoami",
                    "uname -a", "env | head -3", "cat /etc/os-release | head -2", "true", "false")


class RandomCommandPolicy:
    """Baseline: `n_turns` random task-agnostic shell commands, then stop."""

    def __init__(self, seed: int = 0, n_turns: int = 8):
        self._rng = random.Random(seed)
        self._n = n_turns

    def __call__(self, conv: Conversation) -> Action | None:
        if len(conv.turns) >= self._n:
            return None
        cmd = self._rng.choice(_RANDOM_COMMANDS)
        return Action("random command", "execute_code", {"language": "bash", "code": cmd})


class ChatTeacher:
    """The LLM teacher: an action-level policy over an OpenAI-compatible chat endpoint.

    It is the Data Factory's 'openai' teacher. Its system prompt asks for one JSON action per turn that also names the
    action's stage ('S1'..'S5'), so stage boundaries and stage-start states can be found in its trajectories. Endpoint
    failures and unparsable replies raise `PolicyError` ('teacher <cause>: ...'), which the episode loop
    (`rollout/action_loop.py`) turns into a rejected episode.
    """

    NOTE = (' Also include "stage": one of "S1".."S5", the workflow stage (Plan, Setup, Validate, Inference, '
            'Submit) the action belongs to.')

    def __init__(self, config: ChatEndpointConfig, sleep=time.sleep):
        self._client = ChatClient(config, sleep)

    def __call__(self, conv: Conversation) -> Action | None:
        messages = conv.messages()
        messages[0] = {**messages[0], "content": messages[0]["content"] + self.NOTE}
        try:
            content = self._client.complete(messages)
        except ChatError as exc:
            raise PolicyError(f"teacher {exc.cause}: {exc}") from None
        try:
            data = json.loads(re.search(r"\{[\s\S]*\}", content).group(0))
            stage = data.get("stage") if isinstance(data, dict) else None
            return Action.from_dict(data, STAGES.parse(stage) if stage else None)
        except (AttributeError, TypeError, ValueError) as exc:
            raise PolicyError(f"teacher bad_reply: {exc}") from None
