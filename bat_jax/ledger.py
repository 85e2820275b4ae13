"""The round ledger: one JSON line per BiCuRL round, read back on restart.

Source: paper Section 2.2.2 ("BaT records each round's Stage Bank states, pool mixture, reward version,
controller scores, and retained checkpoint"). A killed run resumes from the ledger and its Orbax checkpoints.

Details: docs/design.md.
"""

from __future__ import annotations

import dataclasses
import json
import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bat_jax.atomic_io import atomic_write
from bat_jax.benchmark.items import ItemRates

FORMAT = 2


def _without_torn_line(data: bytes, path: Path) -> bytes:
    """`data` cut after its last complete line, ending in a newline.

    A last line without a newline that is not valid JSON is a write cut short (e.g. a crash while a ledger was
    appended in place by something other than `Ledger.append`, or a partial copy): it is dropped with a
    `RuntimeWarning` naming file and line, so a restarted run redoes that round instead of failing to start.
    A last line without a newline that is valid JSON is kept (a newline is added).
    """
    keep = data[: data.rfind(b"\n") + 1]
    tail = data[len(keep):]
    if not tail.strip():
        return keep
    try:
        json.loads(tail)
    except ValueError:  # JSONDecodeError, or UnicodeDecodeError of a multi-byte character cut in two
        line = keep.count(b"\n") + 1
        warnings.warn(f"{path}: line {line}: torn last line ({len(tail)} bytes, no newline, not JSON) dropped; "
                      f"its round will be redone", RuntimeWarning, stacklevel=4)
        return keep
    return data + b"\n"


class LedgerError(RuntimeError):
    """A ledger line is malformed or a round is out of order (message names file and line)."""


@dataclasses.dataclass(frozen=True)
class GRPOStats:
    """What one round's GRPO block did (`bicurl/grpo_round.py` fills it; every count covers every drawn rollout).

    Attributes:
      rollouts: GRPO rollouts of the round, dynamic sampling's dropped groups included.
      unscored: rollouts left unscored (infrastructure: engine or sandbox start failed, LLM judge unreachable).
      agent_failed: scored rollouts whose sandbox the agent's own code killed or hung (`Trajectory.agent_error`);
        scored from the evidence gathered until then, so never among `unscored`.
      reward_mean: mean scored reward (0–1) over the round, None when nothing was scored.
      reward_version: identity of the reward contract / verifier version ('none' when nothing was scored).
      pool_reward_before, pool_reward_after: mean scored reward of the round's first pool batch rolled out with the
        round-start policy, and of the same rows rolled out with the same seed after the update (None: nothing
        scored).
      groups_with_variance, groups_scored: trained groups (K rollouts of one row) whose scored rewards differ, and
        those with at least two scored rewards; GRPO learns only from the first.
      groups_drawn, groups_dropped, groups_trained: groups rolled out, dropped for lack of reward variance (dynamic
        sampling; 0 without it) and trained.
      trained_pool_counts: trained groups per pool ('target', 'mix', 'e2e'), replacements included.
      update_logp_shift_pos, update_logp_shift_neg, update_token_kl: how the block moved its first trained batch's
        own rollouts (`grpo.update_shift`: token-mean logprob change in nats for positive / negative advantages,
        and KL(old ‖ new) per token); None when no batch was trained.
      rollout_mismatch: the round's `learn.rollout_correction.METRICS` (mean / max |log π_learner − log π_engine|
        on sampled tokens, nats; share of tokens truncated and rollouts masked by rollout correction, 0 without it),
        recorded whenever the learner's logprobs of the batch are at hand; None when not measured.
      judge: the LLM judge's counters over the round (`RubricJudge.stats()`), None without a judge.
      items: rubric item pass counts over the round's scored rollouts (`benchmark.items.ItemRates.to_dict()`:
        stage → item → track → [passed, decided]; a stage row's rollouts decide its stage's items only); None when
        not recorded (an older ledger) or nothing was scored.
      groups_dropped_stale, groups_evicted, groups_aborted, groups_refilled: bounded-staleness GRPO
        (`learn/staleness.py`, `bicurl/async_block.py`; 0 in the synchronous block): groups dropped as older than
        `max_staleness`, evicted for an infrastructure-failed rollout, re-queued after a sync under on_sync='abort',
        and groups rolled out to refill those slots.
      staleness_mean, staleness_max: weight versions between the start of a trained group's oldest rollout and the
        step that trained it, mean and max over the round's trained groups; None in the synchronous block (0 by
        construction) or when nothing was trained.
    """

    rollouts: int = 0
    unscored: int = 0
    agent_failed: int = 0
    reward_mean: float | None = None
    reward_version: str = "none"
    pool_reward_before: float | None = None
    pool_reward_after: float | None = None
    groups_with_variance: int = 0
    groups_scored: int = 0
    groups_drawn: int = 0
    groups_dropped: int = 0
    groups_trained: int = 0
    trained_pool_counts: Mapping[str, int] = dataclasses.field(default_factory=dict)
    update_logp_shift_pos: float | None = None
    update_logp_shift_neg: float | None = None
    update_token_kl: float | None = None
    rollout_mismatch: Mapping[str, float] | None = None
    judge: Mapping[str, float] | None = None
    items: Mapping[str, Any] | None = None
    groups_dropped_stale: int = 0
    groups_evicted: int = 0
    groups_aborted: int = 0
    groups_refilled: int = 0
    staleness_mean: float | None = None
    staleness_max: int | None = None

    def item_rates(self) -> ItemRates:
        """`items` as `ItemRates` (empty when not recorded)."""
        return ItemRates.from_dict(self.items, "grpo.items")

    def scalars(self) -> dict[str, float]:
        """The numeric fields as TensorBoard scalars ('grpo/<name>').

        None and mappings are left out, except the judge's and the mismatch's numbers, prefixed, and the item pass rates
        as 'items/<stage>/<item>', 0–100."""
        out = {k: float(v) for k, v in dataclasses.asdict(self).items()
               if isinstance(v, (int, float)) and not isinstance(v, bool)}
        out.update({f"rc_{k}": float(v) for k, v in (self.rollout_mismatch or {}).items()})
        out.update({f"judge_{k}": float(v) for k, v in (self.judge or {}).items()})
        out.update({f"items/{k}": v for k, v in self.item_rates().scalars().items()})
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "GRPOStats":
        """Raises TypeError on unexpected fields, ValueError on malformed item counts."""
        stats = cls(**d)
        stats.item_rates()
        return stats


@dataclasses.dataclass(frozen=True)
class RoundRecord:
    """Everything one round decided.

    Attributes:
      round: round index r (int, strictly increasing in a ledger).
      selected_stage: s*, one of the run's stage ids.
      routing_report: the router's audit report (`RoutingDecision.report()`).
      pool_counts: rows drawn per pool, e.g. {'target': 400, 'mix': 200, 'e2e': 200}.
      bank_version: Stage Bank version the round drew from (resolved at round start: the newest admitted or the
        pinned one).
      state_ids: bank state_ids drawn, in draw order.
      reward_version: identity of the reward contract / verifier version.
      controller_scores: the controller evaluation of the candidate (`Evaluation.to_dict()`; overall None when
        every cell was unscored).
      kl: mean per-token KL(candidate ‖ θ*) in nats, or None.
      decision: one of `curriculum.controller.DECISIONS`: 'accept', 'fallback', 'hold' or 'unscored' (every
        controller cell unscored: neither accepted nor counted as a drop).
      retained_checkpoint: checkpoint the next round starts from.
      controller_state: `ControllerState.to_dict()` after the decision (for resume).
      decision_reasons: why the candidate was not accepted (the controller's reasons), () when accepted.
      eval_cells, eval_unscored: cells of the round's controller evaluation, and those unscored.
      eval_agent_failed: scored controller-evaluation cells that were agent-caused sandbox failures.
      grpo: what the round's GRPO block did (`GRPOStats`).
      bank_rows_new: RL rows in `bank_version` that the previous round's version (round 1: the cold start's) did not
        have; None in ledgers written before rounds read versions.
      factory: the line saying the Data Factory beside the run ended on its own during this round ('' otherwise).
      eval_items: rubric item pass counts of the controller evaluation (`benchmark.items.ItemRates.to_dict()`:
        aggregates only, like the stage scores); None when not recorded (an older ledger). The router never reads
        them.
    """

    round: int
    selected_stage: str
    routing_report: Mapping[str, Any]
    pool_counts: Mapping[str, int]
    bank_version: int
    state_ids: Sequence[str]
    reward_version: str
    controller_scores: Mapping[str, Any]
    kl: float | None
    decision: str
    retained_checkpoint: str
    controller_state: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    decision_reasons: Sequence[str] = ()
    eval_cells: int | None = None
    eval_unscored: int | None = None
    eval_agent_failed: int | None = None
    grpo: GRPOStats = GRPOStats()
    bank_rows_new: int | None = None
    factory: str = ""
    eval_items: Mapping[str, Any] | None = None

    def eval_item_rates(self) -> ItemRates:
        """`eval_items` as `ItemRates` (empty when not recorded)."""
        return ItemRates.from_dict(self.eval_items, "eval_items")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["state_ids"] = list(self.state_ids)
        d["decision_reasons"] = list(self.decision_reasons)
        return {"format": FORMAT, **d}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "RoundRecord":
        """A `RoundRecord` from a ledger line's dict.

        A format-1 line (the GRPO block's figures flat in the record) is read into the nested `grpo`.

        Raises:
          KeyError, TypeError: missing or unexpected fields (`Ledger.read` wraps them)."""
        d = dict(d)
        if d.pop("format", FORMAT) == 1:
            d = _from_format_1(d)
        fields = {f.name for f in dataclasses.fields(cls)}
        extra = set(d) - fields
        if extra:
            raise TypeError(f"unexpected fields {sorted(extra)}")
        if "grpo" in d:
            d["grpo"] = GRPOStats.from_dict(d["grpo"])
        d["decision_reasons"] = tuple(d.get("decision_reasons", ()))
        record = cls(**{k: d[k] for k in fields if k in d})
        record.eval_item_rates()
        return record


#: Format-1 field → `GRPOStats` field (format 1 kept the GRPO block's figures flat in the round record).
_FORMAT_1_GRPO = {"rollouts": "rollouts", "unscored_rollouts": "unscored", "agent_failed_rollouts": "agent_failed",
                  "pool_reward_before": "pool_reward_before", "pool_reward_after": "pool_reward_after",
                  "groups_with_variance": "groups_with_variance", "groups_scored": "groups_scored",
                  "update_logp_shift_pos": "update_logp_shift_pos", "update_logp_shift_neg": "update_logp_shift_neg",
                  "update_token_kl": "update_token_kl", "groups_drawn": "groups_drawn",
                  "groups_dropped": "groups_dropped", "groups_trained": "groups_trained",
                  "rollout_mismatch": "rollout_mismatch", "trained_pool_counts": "trained_pool_counts"}


def _from_format_1(d: dict[str, Any]) -> dict[str, Any]:
    """A format-1 record's fields in today's layout (None counts of the oldest lines become 0 / empty)."""
    grpo = {new: d.pop(old) for old, new in _FORMAT_1_GRPO.items() if old in d}
    grpo = {k: v for k, v in grpo.items() if v is not None or k.startswith(("pool_", "update_", "rollout_"))}
    grpo["reward_version"] = d.get("reward_version", "none")
    return {**d, "grpo": grpo}


class Ledger:
    """A JSON-lines ledger file."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    def read(self) -> list[RoundRecord]:
        """All records, in order ([] when the file does not exist).

        A torn last line (no newline, not JSON: a write cut short) is dropped with a RuntimeWarning.

        Raises:
          LedgerError: a malformed line or non-increasing rounds (names file and line).
        """
        return self._load()[0]

    def _load(self) -> tuple[list[RoundRecord], bytes]:
        """(records, the file's bytes up to its last complete line); see `_without_torn_line`."""
        if not self.path.exists():
            return [], b""
        data = _without_torn_line(self.path.read_bytes(), self.path)
        records: list[RoundRecord] = []
        for i, line in enumerate(data.decode("utf-8").splitlines()):
            if not line.strip():
                continue
            try:
                rec = RoundRecord.from_dict(json.loads(line))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
                raise LedgerError(f"{self.path}: line {i + 1}: malformed round record ({e})") from e
            if records and rec.round <= records[-1].round:
                raise LedgerError(f"{self.path}: line {i + 1}: round {rec.round} after round {records[-1].round}")
            records.append(rec)
        return records, data

    def last(self) -> RoundRecord | None:
        """The latest record, or None."""
        records = self.read()
        return records[-1] if records else None

    def append(self, record: RoundRecord) -> None:
        """Adds one round atomically.

        Raises:
          LedgerError: the round is not greater than the last recorded round (a resumed run must not
            repeat a round), or the record is not JSON-serialisable.
        """
        records, old = self._load()
        if records and record.round <= records[-1].round:
            raise LedgerError(f"{self.path}: round {record.round} is not after the last recorded round "
                              f"{records[-1].round}")
        try:
            line = json.dumps(record.to_dict(), sort_keys=True, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise LedgerError(f"{self.path}: round {record.round} is not JSON-serialisable ({e})") from e
        atomic_write(self.path, old + line.encode("utf-8") + b"\n")
