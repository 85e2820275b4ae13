"""Bounded staleness for off-policy GRPO: which rollout groups may be trained, and what the block counts.

Details: docs/design.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

ON_SYNC = ("continue", "abort")


@dataclasses.dataclass(frozen=True)
class StalenessConfig:
    """Bounded-staleness GRPO (module docstring).

    Attributes:
      max_staleness: s, the most weight versions a trained rollout may have begun before the learner's current
        ones; 0 = the synchronous block (no rollout starts before its step's weights are synced).
      on_sync: 'continue' or 'abort': what an episode in flight does when the weights change.
      evict_failed: evict a group with an infrastructure-failed rollout and refill its slot (off: the group is
        trained on its scored rollouts, as the synchronous block does).
      max_refills: per round, the most groups rolled out to refill dropped (stale, evicted, aborted) slots; a slot
        without a refill is left empty (the step trains on fewer groups).
      concurrent_groups: groups rolled out at once (0: the batch size × (1 + s), every admissible group).
    Raises:
      ValueError: naming the field, for a negative bound or an unknown `on_sync`.
    """

    max_staleness: int = 0
    on_sync: str = "continue"
    evict_failed: bool = True
    max_refills: int = 64
    concurrent_groups: int = 0

    def __post_init__(self):
        for name in ("max_staleness", "max_refills", "concurrent_groups"):
            if getattr(self, name) < 0:
                raise ValueError(f"StalenessConfig.{name} must be >= 0, got {getattr(self, name)}")
        if self.on_sync not in ON_SYNC:
            raise ValueError(f"StalenessConfig.on_sync must be one of {ON_SYNC}, got {self.on_sync!r}")


def began(turn_versions: Sequence[int], fallback: int) -> int:
    """The version a rollout began on: its first turn's, or `fallback` when no turn was sampled."""
    return int(turn_versions[0]) if len(turn_versions) else int(fallback)


def staleness(began_versions: Sequence[int], current: int) -> int:
    """A group's staleness at `current`: how many versions before it its oldest rollout began (0 for none).

    Raises: ValueError when a rollout began on a version after `current` (the versions are not the engine's)."""
    if not len(began_versions):
        return 0
    newest, oldest = max(began_versions), min(began_versions)
    if newest > current:
        raise ValueError(f"staleness: a rollout began on version {newest}, after the current version {current}")
    return int(current - oldest)


def crossed_sync(turn_versions: Sequence[int]) -> bool:
    """Whether a rollout's turns were sampled on more than one weight version (a sync happened during it)."""
    return len(set(turn_versions)) > 1


@dataclasses.dataclass
class Verdict:
    """What the step does with one finished group, and the group's staleness at the current version.

    Decisions: 'train', 'stale' (dropped), 'failed' (evicted) or 'aborted' (re-queued: `on_sync='abort'`)."""

    action: str
    staleness: int


def judge_group(turn_versions: Sequence[Sequence[int]], fallback_versions: Sequence[int],
                infra_failed: Sequence[bool], current: int, config: StalenessConfig) -> Verdict:
    """The verdict on one group of K rollouts at the learner's version `current`.

    The module docstring's rules apply, in this order: an infrastructure failure evicts, a sync crossed under 'abort'
    re-queues, then the bound.

    Args:
      turn_versions: per rollout, its turns' weight versions.
      fallback_versions: per rollout, the version to use when it sampled no turn (`Trajectory.weight_version`).
      infra_failed: per rollout, whether it failed for infrastructure reasons.
      current: the learner's (= the engine's, after the step's sync) weight version.
      config: the bound and the options.
    """
    lag = staleness([began(v, f) for v, f in zip(turn_versions, fallback_versions, strict=True)], current)
    if config.evict_failed and any(infra_failed):
        return Verdict("failed", lag)
    if config.on_sync == "abort" and any(crossed_sync(v) for v in turn_versions):
        return Verdict("aborted", lag)
    if lag > config.max_staleness:
        return Verdict("stale", lag)
    return Verdict("train", lag)


@dataclasses.dataclass
class StaleCounts:
    """A round's bounded-staleness counts.

    Groups dropped as too stale, evicted (infrastructure failure), aborted (re-queued after a sync under 'abort'),
    refill groups rolled out, and the staleness of every trained group."""

    dropped_stale: int = 0
    evicted: int = 0
    aborted: int = 0
    refilled: int = 0
    trained: list[int] = dataclasses.field(default_factory=list)

    def count(self, verdict: Verdict) -> None:
        """Adds one group's verdict."""
        if verdict.action == "train":
            self.trained.append(verdict.staleness)
        elif verdict.action == "stale":
            self.dropped_stale += 1
        elif verdict.action == "failed":
            self.evicted += 1
        elif verdict.action == "aborted":
            self.aborted += 1
        else:
            raise ValueError(f"StaleCounts.count: unknown verdict {verdict.action!r}")

    def summary(self) -> dict[str, float | int | None]:
        """The ledger's bounded-staleness fields.

        `groups_dropped_stale`, `groups_evicted`, `groups_aborted`, `groups_refilled`, `staleness_mean` /
        `staleness_max` over trained groups (None when none was trained)."""
        return {"groups_dropped_stale": self.dropped_stale, "groups_evicted": self.evicted,
                "groups_aborted": self.aborted, "groups_refilled": self.refilled,
                "staleness_mean": float(sum(self.trained) / len(self.trained)) if self.trained else None,
                "staleness_max": int(max(self.trained)) if self.trained else None}
