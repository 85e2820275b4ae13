"""LLM judge for rubric items that need semantic judgement (e.g. "the plan names the recovery steps").

Paper Section 3 / Eq. 4 uses an LLM rubric verifier; here most items are programmatic predicates and a
judge is optional per item. A judged item still rests on evidence keys (no evidence → no credit, as for
every item). A judge that is unreachable or answers unparsably raises `InfraError`, so the stage is
unscored (None), never 0. The judge is asked for a binary verdict at temperature 0.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Protocol

from bat_jax.benchmark.stages import Stage
from bat_jax.tasks.chat_client import ChatError
from bat_jax.verify.rubric import Evidence, InfraError, RubricItem

#: Characters of rendered evidence sent to the judge.
MAX_EVIDENCE_CHARS = 6000

_SYSTEM = ("You are a strict rubric verifier. Decide ONE binary rubric item using ONLY the evidence given "
           "(tool-call receipts and workspace files). Claims in text without supporting evidence do not count. "
           'Answer with one JSON object: {"verdict": "yes" | "no", "reason": "<one sentence>"}.')


class _Completes(Protocol):
    def complete(self, messages: list[dict], temperature: float | None = None) -> str: ...


class LLMJudge:
    """Binary decisions from an OpenAI-compatible model (`tasks.chat_client.ChatClient` or a stub).

    Attributes:
      calls: number of judge requests made; reasons: the judge's last reason per item description.
    """

    def __init__(self, client: _Completes):
        self._client = client
        self.calls = 0
        self.reasons: dict[str, str] = {}

    def decide(self, item: str, evidence_text: str) -> bool:
        """True when the judge answers 'yes'.

        Raises:
          InfraError: endpoint failure or a reply without a yes/no verdict (the stage becomes unscored).
        """
        text = evidence_text[:MAX_EVIDENCE_CHARS]
        messages = [{"role": "system", "content": _SYSTEM},
                    {"role": "user", "content": f"Rubric item: {item}\n\nEvidence:\n{text}"}]
        self.calls += 1
        try:
            reply = self._client.complete(messages, temperature=0.0)
        except ChatError as exc:
            raise InfraError(f"judge unavailable: {exc}") from None
        m = re.search(r"\{[\s\S]*\}", reply)
        try:
            data = json.loads(m.group(0)) if m else {}
        except json.JSONDecodeError:
            data = {}
        verdict = str(data.get("verdict", "")).strip().lower()
        if verdict not in ("yes", "no"):
            raise InfraError(f"judge reply has no yes/no verdict: {reply[:200]!r}")
        self.reasons[item] = str(data.get("reason", ""))
        return verdict == "yes"


def render_evidence(ev: Evidence, paths: tuple[str, ...] = (), max_receipts: int = 8) -> str:
    """Evidence text for the judge: the last receipts (code, exit code, stdout) and the named files."""
    parts = []
    for r in ev.receipts[-max_receipts:]:
        parts.append(f"[receipt {r.index}] tool={r.tool} exit={r.exit_code}\ncode:\n{r.code[:800]}\n"
                     f"stdout:\n{r.stdout[:800]}")
    for p in paths:
        text = ev.text(p)
        parts.append(f"[file {p}]\n{text[:1500] if text is not None else '(missing)'}")
    return "\n\n".join(parts)


def judged_item(item_id: str, stage: Stage, description: str, evidence: tuple[str, ...], judge: LLMJudge,
                render: Callable[[Evidence], str]) -> RubricItem:
    """A rubric item decided by the LLM judge on `render(evidence)`."""
    return RubricItem(item_id, stage, description, evidence, lambda ev: judge.decide(description, render(ev)))
