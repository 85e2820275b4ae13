"""LLM judge for rubric items that need semantic judgement (e.g. "the plan names the recovery steps").

Details: docs/design.md.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import json
import re
import time
import warnings
from collections.abc import Callable
from typing import Protocol

from bat_jax.clients.chat_endpoint import ChatClient, ChatEndpointConfig, ChatError
from bat_jax.verify.rubric import REWARD_VERSION, Evidence, InfraError, Rubric, RubricItem
from bat_jax.verify.verdict import (_CONTROL_EVIDENCE, _CONTROL_ITEM, MAX_EVIDENCE_CHARS, VERDICT_SCHEMA,
                                    VerdictError, fit_evidence, judge_messages, parse_verdict, verdict_shaped)

class _Completes(Protocol):
    def complete(self, messages: list[dict], temperature: float | None = None) -> str: ...


def _takes_response_format(client: _Completes) -> bool:
    try:
        return "response_format" in inspect.signature(client.complete).parameters
    except (TypeError, ValueError):
        return False


#: An endpoint's words for a request over its context window (vLLM, OpenAI, llama.cpp).
_OVER_CONTEXT = re.compile(r"context[ _](?:length|window)|maximum context|too many tokens|exceeds? the context",
                           re.IGNORECASE)


class JudgeLimit(InfraError):
    """The judge could not decide this evidence though it answers the control question: unscored, not the breaker.

    A refusal, a reply cut at max_tokens, an unreadable reply or a timeout on evidence without verdict-shaped text
    (`LLMJudge.decide`)."""


class LLMJudge:
    """Binary decisions from an OpenAI-compatible model (`clients.chat_endpoint.ChatClient` or a stub).

    Attributes:
      calls: number of judge requests made (control questions included); reasons: the judge's last reason per
      item description. evidence_faults: items failed as the agent's doing (below); judge_limits: items left
      unscored as the judge's limit (`JudgeLimit`). structured: whether requests carry `VERDICT_SCHEMA` (the client
      takes `response_format` and the endpoint has not refused it on the host's control question).
      budget_tokens: the most prompt tokens (`verdict.request_tokens`) of a request; None = no bound.
    """

    def __init__(self, client: _Completes, structured: bool = True, budget_tokens: int | None = None):
        self._client = client
        self.calls = 0
        self.evidence_faults = 0
        self.judge_limits = 0
        self.reasons: dict[str, str] = {}
        self.structured = structured and _takes_response_format(client)
        self.budget_tokens = budget_tokens

    def _send(self, messages: list[dict], structured: bool) -> str:
        self.calls += 1
        if structured:
            return self._client.complete(messages, temperature=0.0, response_format=VERDICT_SCHEMA)
        return self._client.complete(messages, temperature=0.0)

    def _ask(self, messages: list[dict]) -> str:
        """The reply text (ChatError passes through).

        A structured request refused (HTTP 4xx) drops structured output for the run only when the host's control
        question is refused structured too and answered in plain text; then this request is asked in plain text."""
        if self.structured:
            try:
                return self._send(messages, True)
            except ChatError as exc:
                if exc.cause != "http_error" or not self._structured_refused():
                    raise
        return self._send(messages, False)

    def _structured_refused(self) -> bool:
        control = judge_messages(_CONTROL_ITEM, _CONTROL_EVIDENCE)
        try:
            self._send(control, True)
            return False
        except ChatError as exc:
            if exc.cause != "http_error":
                return False
        try:
            parse_verdict(self._send(control, False))
        except (ChatError, VerdictError):
            return False
        self.structured = False
        warnings.warn("LLM judge refused response_format on the control question and answered it in plain text; "
                      "verdicts are parsed from plain replies", RuntimeWarning, stacklevel=4)
        return True

    def _control_answered(self) -> bool:
        try:
            parse_verdict(self._ask(judge_messages(_CONTROL_ITEM, _CONTROL_EVIDENCE)))
            return True
        except (ChatError, VerdictError):
            return False

    def decide(self, item: str, evidence_text: str, context: str = "") -> bool:
        """True when the judge answers 'yes'.

        `parse_verdict` reads it from the judge's reply, never from the evidence. Without a verdict (an endpoint
        error, a reply cut for length, a refusal, an unreadable reply) the host-written control question follows.
        Unanswered: the judge is down (InfraError). Answered: the item fails as the agent's doing (False,
        `evidence_faults`) when the evidence request was refused (HTTP 4xx: the request is bounded, so its content
        did it; but a refusal as over the context is the bound's fault) or the reply has no verdict while the
        evidence shown is verdict-shaped (`verdict.verdict_shaped`); otherwise the judge's limit (`JudgeLimit`).

        Raises:
          InfraError: the judge is down, or `JudgeLimit`.
        """
        shown = fit_evidence(item, evidence_text, context, self.budget_tokens)
        try:
            verdict, self.reasons[item] = parse_verdict(self._ask(judge_messages(item, shown, context)))
            return verdict
        except (ChatError, VerdictError) as exc:
            failure = exc
        if not self._control_answered():
            raise InfraError(f"judge unavailable: {failure}") from None
        cause = failure.cause if isinstance(failure, ChatError) else "no_verdict"
        if cause == "http_error" and _OVER_CONTEXT.search(str(failure)):
            warnings.warn(f"LLM judge refused a request as over its context ({failure}); lower "
                          "JudgeConfig.context_tokens to the judge's context window", RuntimeWarning, stacklevel=2)
            cause = "over_context"  # the host's bound was set too high: the judge's limit, never the agent's
        elif cause == "http_error" or (cause != "unreachable" and verdict_shaped(shown)):
            self.evidence_faults += 1
            self.reasons[item] = f"no verdict on this evidence ({failure})"
            return False
        self.judge_limits += 1
        raise JudgeLimit(f"judge could not decide this evidence ({failure}); the item is unscored") from None


def render_evidence(ev: Evidence, paths: tuple[str, ...] = (), max_receipts: int = 8) -> str:
    """Evidence text for the judge: the named files first, then the last `max_receipts` receipts.

    Each file is cut to 1,500 characters; a receipt (code, exit code, stdout) to 800. So the judge's cut at
    `MAX_EVIDENCE_CHARS` drops old receipts, never the files the item is about."""
    parts = []
    for p in paths:
        text = ev.text(p)
        parts.append(f"[file {p}]\n{text[:1500] if text is not None else '(missing)'}")
    for r in ev.receipts[-max_receipts:]:
        parts.append(f"[receipt {r.index}] tool={r.tool} exit={r.exit_code}\ncode:\n{r.code[:800]}\n"
                     f"stdout:\n{r.stdout[:800]}")
    return "\n\n".join(parts)


def judged_item(item_id: str, stage: str, description: str, evidence: tuple[str, ...], judge: LLMJudge,
                render: Callable[[Evidence], str]) -> RubricItem:
    """A rubric item decided by the LLM judge on `render(evidence)`."""
    return RubricItem(item_id, stage, description, evidence, lambda ev: judge.decide(description, render(ev)))


#: Rubric items the judge decides by default: the semantic ones (does a free-text plan say what it must).
#: Items resting on the hidden answer key or on exact artefact formats stay programmatic.
DEFAULT_ITEMS = ("plan.written",)

#: The judge's context window (prompt + reply tokens) a run assumes unless `JudgeConfig.context_tokens` says otherwise.
DEFAULT_CONTEXT_TOKENS = 16384
#: The fewest prompt tokens a judge request may be left after the reply's max_tokens and the schema.
MIN_REQUEST_TOKENS = 4096


@dataclasses.dataclass(frozen=True)
class JudgeConfig:
    """The LLM judge of a run (gin: `experiment.Components.judge = @judge.JudgeConfig()`).

    Attributes:
      endpoint: the judge model's OpenAI-compatible chat endpoint (`clients.chat_endpoint.ChatEndpointConfig`; the
        run files bind it as `judge/chat_endpoint.ChatEndpointConfig`: 120 s per request, 2 retries, 4096 reply
        tokens, room for a reasoning trace). Requests ask at temperature 0; the model's name is in the reward version.
      items: rubric item ids ('<stage>.<name>') whose predicate the judge replaces, checked against the run's
        benchmark at launch (`StagedBenchmark.check_judged_items`); every other item stays programmatic. A judged
        item keeps its evidence gate. An id absent from a task's rubric is skipped for that task.
      trip_after: consecutive decisions with the judge down (an endpoint error or no verdict, and the host's control
        question unanswered too: never what the agent's evidence caused) after which judged items fail fast
        (unscored, no request) for `cooldown_s` seconds; 0 = never.
      structured: ask the endpoint to enforce `VERDICT_SCHEMA` (`response_format`); dropped (a warning) only when
        the endpoint refuses it on the host's control question and answers that in plain text.
      context_tokens: the judge's context window (default `DEFAULT_CONTEXT_TOKENS` = 16384). A request's bound
        (`verdict.request_tokens`) is kept within it less the endpoint's max_tokens and the schema.
    Raises:
      ValueError: items that are not '<stage>.<name>' ids, a negative trip_after, or a context_tokens leaving the
        request under `MIN_REQUEST_TOKENS` (named).
    """

    endpoint: ChatEndpointConfig
    items: tuple[str, ...] = DEFAULT_ITEMS
    trip_after: int = 3
    cooldown_s: float = 300.0
    structured: bool = True
    context_tokens: int = DEFAULT_CONTEXT_TOKENS

    def __post_init__(self):
        object.__setattr__(self, "items", tuple(self.items))
        bad = [i for i in self.items if not isinstance(i, str) or "." not in i or not all(i.split(".", 1))]
        if not self.items or bad:
            raise ValueError(f"JudgeConfig.items must be non-empty rubric item ids '<stage>.<name>'; "
                             f"got {self.items!r}")
        if self.trip_after < 0:
            raise ValueError(f"JudgeConfig.trip_after must be >= 0, got {self.trip_after}")
        if self.budget_tokens < MIN_REQUEST_TOKENS:
            raise ValueError(f"JudgeConfig.context_tokens = {self.context_tokens} leaves {self.budget_tokens} tokens "
                             f"for a request after the endpoint's max_tokens = {self.endpoint.max_tokens} and the "
                             f"schema; at least {MIN_REQUEST_TOKENS} are needed")

    @property
    def budget_tokens(self) -> int:
        """The most prompt tokens a judge request may take: the context less the reply and the schema."""
        return self.context_tokens - self.endpoint.max_tokens - len(json.dumps(VERDICT_SCHEMA))


def evidence_digest(description: str, evidence_text: str, context: str = "", budget_tokens: int | None = None) -> str:
    """sha256 hex of what the judge is shown for one item (its request: description, context, evidence as cut)."""
    messages = judge_messages(description, evidence_text, context, budget_tokens)
    return hashlib.sha256(json.dumps(messages, sort_keys=True).encode("utf-8")).hexdigest()


class RubricJudge:
    """The judge of one run: decides the configured rubric items, caching verdicts.

    It caches verdicts by (item id, evidence digest) and stops calling a dead endpoint for a while (see
    `JudgeConfig.trip_after`).

    Attributes:
      config: the JudgeConfig. llm: the underlying LLMJudge (`llm.calls` = requests made).
      cache: (item_id, evidence digest) → verdict; only verdicts are cached, never failures.
      cache_hits, failures, skipped: decisions served from the cache; decisions with the judge down (InfraError
        but `JudgeLimit`, fast failures included); fast failures without a request.
    """

    def __init__(self, config: JudgeConfig, client: _Completes | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.config = config
        self._client = client if client is not None else ChatClient(config.endpoint)
        self.llm = LLMJudge(self._client, config.structured, config.budget_tokens)
        self.cache: dict[tuple[str, str], bool] = {}
        self.cache_hits = self.failures = self.skipped = 0
        self._clock = clock
        self._consecutive = 0
        self._down_until = float("-inf")

    @property
    def version(self) -> str:
        """Reward version of rubric scores that use this judge, e.g. 'bat_rubric/v3+judge:m[plan.written]'."""
        return f"{REWARD_VERSION}+judge:{self.config.endpoint.model}[{','.join(self.config.items)}]"

    def check_endpoint(self) -> bool:
        """One request at run start; True when the endpoint answered.

        A refusal of the request itself (HTTP 4xx: wrong model name, key or path) would leave every judged item unscored
        for the whole run, so it stops the run; an unreachable endpoint only warns (the run goes on, judged items
        unscored until it answers).

        Raises:
          ValueError: the endpoint rejected the request (names base_url, model and the status).
        """
        try:
            self._client.complete([{"role": "user", "content": 'Reply with {"verdict": "yes"}.'}],
                                      temperature=0.0)
        except ChatError as exc:
            if exc.cause == "http_error":
                raise ValueError(f"LLM judge {self.config.endpoint.base_url} (model {self.config.endpoint.model!r}) "
                                 f"rejected a request: {exc}; check the judge's ChatEndpointConfig base_url / model / "
                                 "api_key_env") from None
            warnings.warn(f"LLM judge {self.config.endpoint.base_url} did not answer ({exc}); judged rubric items stay "
                          f"unscored until it does", RuntimeWarning, stacklevel=2)
            return False
        return True

    def stats(self) -> dict[str, int]:
        """Counters: requests, cache hits, failures, skipped, evidence faults and judge limits.

        Failures: the judge down; skipped: failed fast while down; evidence_faults: items failed as the agent's doing;
        judge_limits: items unscored as the judge's limit (`LLMJudge.decide`)."""
        return {"calls": self.llm.calls, "cache_hits": self.cache_hits, "failures": self.failures,
                "skipped": self.skipped, "evidence_faults": self.llm.evidence_faults,
                "judge_limits": self.llm.judge_limits}

    def decide(self, item: RubricItem, evidence_text: str, context: str = "") -> bool:
        """The judge's verdict on `item` for this evidence text and the host's `context`.

        `context` is the task's brief and the item's evidence requirements. Verdicts are cached by item id and the
        digest of all three.

        Raises:
          InfraError: the endpoint failed, is marked down, or is at fault for a reply without a verdict
            (`LLMJudge.decide`; the stage is unscored).
        """
        key = (item.item_id, evidence_digest(item.description, evidence_text, context, self.config.budget_tokens))
        if key in self.cache:
            self.cache_hits += 1
            return self.cache[key]
        if self._clock() < self._down_until:
            self.failures += 1
            self.skipped += 1
            raise InfraError(f"judge {self.config.endpoint.base_url} marked down after {self.config.trip_after} "
                             "failures")
        try:
            verdict = self.llm.decide(item.description, evidence_text, context)
        except JudgeLimit:
            self._consecutive = 0  # the judge answered the control question: it is up
            raise
        except InfraError:
            self.failures += 1
            self._consecutive += 1
            if self.config.trip_after and self._consecutive >= self.config.trip_after:
                self._down_until = self._clock() + self.config.cooldown_s
                self._consecutive = 0
            raise
        self._consecutive = 0
        self.cache[key] = verdict
        return verdict

    def apply(self, rubric: Rubric, brief: str, facts: Callable[[str], str] = lambda item_id: "") -> Rubric:
        """`rubric` with the configured items decided by the judge.

        The judge is shown the host's words — the item, `brief` (the host task's brief, `Task.brief`: never the
        workspace's `task.md`, which the agent can rewrite), the descriptions of the item's evidence requirements and
        `facts(item_id)` (the benchmark's `judge_facts`) — and, as the agent's evidence, the workspace files those
        requirements are (`EvidenceRequirement.path`) and the last receipts."""
        items = []
        for item in rubric.items:
            if item.item_id in self.config.items:
                reqs = [rubric.requirements[k] for k in item.evidence]
                paths = tuple(dict.fromkeys(r.path for r in reqs if r.path))
                context = host_context(brief, tuple(r.description for r in reqs), facts(item.item_id))
                item = dataclasses.replace(item, check=functools.partial(self._check, item, paths, context))
            items.append(item)
        return dataclasses.replace(rubric, items=tuple(items))

    def _check(self, item: RubricItem, paths: tuple[str, ...], context: str, ev: Evidence) -> bool:
        return self.decide(item, render_evidence(ev, paths), context)


def host_context(brief: str, requirements: tuple[str, ...], facts: str = "") -> str:
    """The host's part of a judge request besides the item: the task brief, the evidence required, the host's facts."""
    reqs = "\n".join(f"- {r}" for r in requirements) or "- (none)"
    text = f"Task brief (from the host):\n<<<BRIEF\n{brief.strip()}\nBRIEF>>>\n\nEvidence the item requires:\n{reqs}"
    return text + (f"\n\nFacts the host computed (true; check the evidence against them):\n{facts.strip()}"
                   if facts.strip() else "")
