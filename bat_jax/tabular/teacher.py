"""The tabular suite's scripted teacher: one fixed action text per stage, whatever the task.

Its code reads the task id and the question's parameters out of `task.md` when it runs, so every task — every
family, variant and held-out table — gets the same five action texts (inspect, clean, analyse, report, submit): a
small policy learns one workflow rather than copying literals from the prompt. Stdlib only (csv, json, re,
statistics), so it runs the same in the Docker sandbox image (Debian's python3) and the local backend. Each step
prints the next step's name first, and the next thought repeats it.
"""

from __future__ import annotations

from bat_jax.sandbox.tools import Action
from bat_jax.staged_benchmark.episode import Conversation
from bat_jax.tabular.tasks import RESULT

#: Version of the action texts (a Stage Bank recipe names it: rows of two versions are not trained on together).
VERSION = "v1"

_VALID = """def num(c):
    try:
        return abs(float(c)) < float("inf")
    except ValueError:
        return False
ok = lambda r: len(r) == len(H) and r[1].strip() != "" and all(num(c) for c in r[2:])
"""

INSPECT = """# inspect: profile the raw table
print("next: clean")
import csv, json, os, re
T = re.search(r"Task id: (\\S+)", open("task.md").read()).group(1)
H, *D = list(csv.reader(open("data/raw.csv")))
""" + _VALID + """ids = [r[0] for r in D]
P = {"rows": len(D), "columns": H, "duplicate_ids": sum(ids[i] in ids[:i] for i in range(len(ids))),
     "invalid_rows": sum(not ok(r) for r in D)}
os.makedirs("work", exist_ok=True)
json.dump(P, open("work/inspect.json", "w"))
print(T, P)
"""

CLEAN = """# clean: apply the cleaning rule
print("next: analyse")
import csv, json, os
H, *D = list(csv.reader(open("data/raw.csv")))
""" + _VALID + """seen, K, dup, bad = set(), [], 0, 0
for r in D:
    if r[0] in seen:
        dup += 1
        continue
    seen.add(r[0])
    if ok(r):
        K.append(r)
    else:
        bad += 1
os.makedirs("work", exist_ok=True)
with open("work/clean.csv", "w", newline="") as f:
    csv.writer(f).writerows([H] + K)
json.dump({"kept": len(K), "dropped_duplicates": dup, "dropped_invalid": bad}, open("work/clean.json", "w"))
print(len(K), "rows kept")
"""

ANALYSE = """# analyse: answer the question on the clean table
print("next: report")
import csv, json, re, statistics as st
Q = json.loads(re.search(r"Parameters: (.+)", open("task.md").read()).group(1))
H, *D = list(csv.reader(open("work/clean.csv")))
col = lambda n: [float(r[H.index(n)]) for r in D]
if Q["family"] == "group_mean":
    g = {}
    for r in D:
        g.setdefault(r[H.index(Q["group"])], []).append(float(r[H.index(Q["value"])]))
    A = {k: st.fmean(v) for k, v in sorted(g.items())}
elif Q["family"] == "filtered_median":
    v = col(Q["value"])
    m = st.median(v)
    d = st.median([abs(x - m) for x in v])
    A = st.median([x for x in v if abs(x - m) <= Q["mad_k"] * d] if d > 0 else v)
else:
    c = {n: abs(st.correlation(col(n), col(Q["target"]))) for n in Q["candidates"]}
    A = sorted(c, key=lambda n: -c[n])[:Q["k"]]
json.dump({"answer": A}, open("work/result.json", "w"))
print(A)
"""

REPORT = """# report: write the report
print("next: submit")
import json, re
T = re.search(r"Task id: (\\S+)", open("task.md").read()).group(1)
A = json.load(open("work/result.json"))["answer"]
n = json.load(open("work/clean.json"))["kept"]
if isinstance(A, dict):
    s = "\\n".join(f"- {k}: {v:.2f}" for k, v in A.items())
else:
    s = ", ".join(A) if isinstance(A, list) else f"{A:.2f}"
open("work/report.md", "w").write(f"# Report {T}\\n{n} rows kept\\nAnswer:\\n{s}\\n")
print(open("work/report.md").read())
"""


def _code(stage: str, code: str) -> Action:
    return Action(f"Next: {stage}.", "execute_code", {"language": "python", "code": code}, stage)


#: The teacher's actions per stage, in order.
SCRIPT = {"inspect": (_code("inspect", INSPECT),), "clean": (_code("clean", CLEAN),),
          "analyse": (_code("analyse", ANALYSE),),
          "report": (_code("report", REPORT), Action("Next: submit.", "submit", {"path": RESULT}, "report"))}


class ScriptedTeacher:
    """The scripted teacher: the actions of the conversation's stages (`SCRIPT`), one per turn, then None."""

    script = SCRIPT

    def __call__(self, conversation: Conversation) -> Action | None:
        todo = [a for s in conversation.stages for a in self.script[s]]
        return todo[len(conversation.turns)] if len(conversation.turns) < len(todo) else None

