"""Steering the Data Factory by aggregates only.

The record a run publishes after each round, and the rule by which the factory's next sources favour the weak
stage.

Details: docs/design.md.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bat_jax.atomic_io import atomic_write
from bat_jax.benchmark.stages import StageSet
from bat_jax.stage_bank.factory import FactoryConfig, Source
from bat_jax.stage_bank.prescription import PrescriptionError, check_prescription
from bat_jax.stage_bank.row import content_digest
from bat_jax.staged_benchmark.contract import StagedBenchmark

STEERING_FILE = "steering.json"


@dataclasses.dataclass(frozen=True)
class SteeringRule:
    """How a steering record shapes the factory's next version.

    Attributes:
      sources_per_version: sources n built into each new version.
      weak_share: share of them whose focus is the routed (weakest) stage s*, rounded half up; the rest are spread
        uniformly over the foci (0: ignore the record).
    """

    sources_per_version: int = 8
    weak_share: float = 0.5

    def __post_init__(self):
        if self.sources_per_version < 1 or not 0.0 <= self.weak_share <= 1.0:
            raise ValueError(f"SteeringRule needs sources_per_version >= 1 and 0 <= weak_share <= 1, got "
                             f"{self.sources_per_version}, {self.weak_share}")


def steering_path(bank_dir: str | os.PathLike) -> Path:
    return Path(bank_dir) / STEERING_FILE


def publish(bank_dir: str | os.PathLike, record: Mapping[str, Any], stages: StageSet) -> dict[str, Any]:
    """Checks `record` against the firewall and writes it atomically as the bank's steering record; returns it.

    Stage scores that are None (stages nobody scored) are left out rather than written.

    Raises:
      PrescriptionError: a field or value that is not an aggregate (names the field).
    """
    record = dict(record)
    if isinstance(record.get("stage_scores"), Mapping):
        record["stage_scores"] = {k: v for k, v in record["stage_scores"].items() if v is not None}
    if record.get("overall") is None:
        record.pop("overall", None)
    clean = check_prescription(record, stages)
    atomic_write(steering_path(bank_dir), json.dumps(clean, sort_keys=True).encode())
    return clean


def read(bank_dir: str | os.PathLike, stages: StageSet) -> dict[str, Any] | None:
    """The bank's steering record, or None when there is none.

    An unreadable or non-aggregate record is ignored with a RuntimeWarning naming the file (the factory then builds
    uniformly)."""
    path = steering_path(bank_dir)
    try:
        return check_prescription(json.loads(path.read_text("utf-8")), stages)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, PrescriptionError) as e:
        warnings.warn(f"{path}: steering record ignored ({e})", RuntimeWarning, stacklevel=2)
        return None


def steered_foci(foci: tuple[str, ...], target: str | None, generation: int, rule: SteeringRule) -> list[str]:
    """The foci of one version's n sources under `rule` (module docstring): s* first, then the uniform rotation."""
    n = rule.sources_per_version
    weak = math.floor(n * rule.weak_share + 0.5) if target in foci else 0
    uniform = n - weak
    return [target] * weak + [foci[(generation * uniform + j) % len(foci)] for j in range(uniform)]


def steered_sources(config: FactoryConfig, benchmark: StagedBenchmark, record: Mapping[str, Any] | None,
                    generation: int, rule: SteeringRule) -> list[Source]:
    """The sources of the factory's next version (generation `generation`).

    They follow the steering record `record` (None: uniform) and `rule`; foci, tracks and outcomes are
    `config.grid(benchmark)`'s."""
    foci, tracks, outcomes = config.grid(benchmark)
    target = record.get("target_stage") if record else None
    out = []
    for i, focus in enumerate(steered_foci(tuple(foci), target, generation, rule)):
        k = generation * rule.sources_per_version + i
        track, outcome = tracks[k % len(tracks)], outcomes[(k // len(tracks)) % len(outcomes)]
        h = content_digest([config.seed, "steered", generation, i, focus, track, outcome])
        out.append(Source(i, focus, track, outcome, int(h[:12], 16) % benchmark.training_seeds,
                          benchmark.source_template(h)))
    return out
