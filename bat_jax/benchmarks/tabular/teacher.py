"""The tabular suite's scripted teacher: one fixed action text per stage, whatever the task.

Details: docs/design.md.
"""

from __future__ import annotations

import textwrap

from bat_jax.sandbox.tools import Action
from bat_jax.staged_benchmark.episode import Conversation
from bat_jax.benchmarks.tabular.tasks import RESULT

#: Version of the action texts (a Stage Bank recipe names it: rows of two versions are not trained on together).
#: v2: each stage's own body first, the shared text after it (v1 shared whole lines between stages mid-action).
#: v3: top_corr answers {column: r}; the report states only its numbers (the rubric's report rule).
VERSION = "v3"

#: Ends every action after its body: the brief's task id T and parameters Q, the table reader and the record check.
#: Reading task.md is every action's; only a body that calls `table` reads a table.
PREAMBLE = """import csv, json, os, re, statistics as st
B = open("task.md").read()
T = re.search(r"Task id: (\\S+)", B).group(1)
Q = json.loads(re.search(r"Parameters: (.+)", B).group(1))
table = lambda p: list(csv.reader(open(p)))
def num(c):
    try:
        return abs(float(c)) < float("inf")
    except ValueError:
        return False
ok = lambda h, r: len(r) == len(h) and r[1].strip() != "" and all(num(c) for c in r[2:])
os.makedirs("work", exist_ok=True)
run()
"""

INSPECT = """# inspect: profile the raw table
print("next: clean")
H, *D = table("data/raw.csv")
ids = [r[0] for r in D]
P = {"rows": len(D), "columns": H, "duplicate_ids": sum(ids[i] in ids[:i] for i in range(len(ids))),
     "invalid_rows": sum(not ok(H, r) for r in D)}
json.dump(P, open("work/inspect.json", "w"))
print(T, P)
"""

CLEAN = """# clean: apply the cleaning rule
print("next: analyse")
head, *raw = table("data/raw.csv")
seen, kept, dup, bad = set(), [], 0, 0
for rec in raw:
    if rec[0] in seen:
        dup += 1
        continue
    seen.add(rec[0])
    if ok(head, rec):
        kept.append(rec)
    else:
        bad += 1
with open("work/clean.csv", "w", newline="") as f:
    csv.writer(f).writerows([head] + kept)
json.dump({"kept": len(kept), "dropped_duplicates": dup, "dropped_invalid": bad}, open("work/clean.json", "w"))
print(len(kept), "rows kept")
"""

ANALYSE = """# analyse: answer the question on the clean table
print("next: report")
C, *K = table("work/clean.csv")
col = lambda n: [float(x[C.index(n)]) for x in K]
if Q["family"] == "group_mean":
    g = {}
    for x in K:
        g.setdefault(x[C.index(Q["group"])], []).append(float(x[C.index(Q["value"])]))
    A = {k: st.fmean(v) for k, v in sorted(g.items())}
elif Q["family"] == "filtered_median":
    v = col(Q["value"])
    m = st.median(v)
    d = st.median([abs(y - m) for y in v])
    A = st.median([y for y in v if abs(y - m) <= Q["mad_k"] * d] if d > 0 else v)
else:
    c = {n: st.correlation(col(n), col(Q["target"])) for n in Q["candidates"]}
    A = {n: c[n] for n in sorted(c, key=lambda n: -abs(c[n]))[:Q["k"]]}
json.dump({"answer": A}, open("work/result.json", "w"))
print(A)
"""

REPORT = """# report: write the report
print("next: submit")
ans = json.load(open("work/result.json"))["answer"]
n = json.load(open("work/clean.json"))["kept"]
s = "\\n".join(f"- {k}: {v:.2f}" for k, v in ans.items()) if isinstance(ans, dict) else f"{ans:.2f}"
open("work/report.md", "w").write(f"# Report {T}\\n{n} rows kept\\nAnswer:\\n{s}\\n")
print(open("work/report.md").read())
"""

#: Each stage's own body, in workflow order.
BODIES = {"inspect": INSPECT, "clean": CLEAN, "analyse": ANALYSE, "report": REPORT}


def action_code(body: str) -> str:
    """An action's code: `body` as `run()`, then the shared `PREAMBLE` (which ends with the call)."""
    return "def run():\n" + textwrap.indent(body, "    ") + "\n" + PREAMBLE


def shared_span(a: str, b: str) -> str:
    """The longest stretch of text (characters) that both `a` and `b` contain.

    It is what a policy writing one of them would have to get past without mistaking it for the other."""
    best = ""
    previous = [0] * (len(b) + 1)
    for i in range(1, len(a) + 1):
        current = [0] * (len(b) + 1)
        for j in range(1, len(b) + 1):
            if a[i - 1] == b[j - 1]:
                current[j] = previous[j - 1] + 1
                if current[j] > len(best):
                    best = a[i - current[j]:i]
        previous = current
    return best


def _code(stage: str, body: str) -> Action:
    return Action(f"Next: {stage}.", "execute_code", {"language": "python", "code": action_code(body)}, stage)


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
