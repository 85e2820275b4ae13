"""The BiCuRL experiment: SFT cold start once, then rounds of evaluate → route → practise → re-evaluate.

Gin binds `run` and `BiCuRLConfig` (gin/bicurl_*.gin); this module itself is plain Python.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Mapping

#: Pool names of paper Eq. 5.
POOLS = ("S-target", "S-mix", "E2E")


@dataclasses.dataclass(frozen=True)
class BiCuRLConfig:
    """Numbers of the outer and inner loop (paper defaults; REFERENCE.md).

    Attributes:
      rounds: outer-loop rounds R.
      grpo_steps_per_round: GRPO optimizer steps per round block.
      num_rollouts: K rollouts per state_id group.
      temperature: rollout sampling temperature.
      kl_beta: β of the GRPO KL penalty.
      actor_lr: GRPO learning rate.
      pool_proportions: S-target / S-mix / E2E shares ρ (Eq. 5), summing to 1; an omitted pool is dropped.
      kl_tau: τ, fallback when mean per-token KL(candidate ‖ best) exceeds it (Eq. 6).
      patience: consecutive Overall drops before fallback (Eq. 6).
      seed: run seed.
    """

    rounds: int = 10
    grpo_steps_per_round: int = 50
    num_rollouts: int = 4
    temperature: float = 0.7
    kl_beta: float = 1e-3
    actor_lr: float = 1e-6
    pool_proportions: Mapping[str, float] = dataclasses.field(
        default_factory=lambda: {"S-target": 0.5, "S-mix": 0.25, "E2E": 0.25})
    kl_tau: float = 0.1
    patience: int = 3
    seed: int = 42

    def __post_init__(self):
        unknown = sorted(set(self.pool_proportions) - set(POOLS))
        if unknown:
            raise ValueError(f"BiCuRLConfig.pool_proportions has unknown pools {unknown}; known: {list(POOLS)}")
        total = sum(self.pool_proportions.values())
        if abs(total - 1.0) > 1e-9 or any(v < 0 for v in self.pool_proportions.values()):
            raise ValueError(f"BiCuRLConfig.pool_proportions must be >= 0 and sum to 1, got {dict(self.pool_proportions)}")
        if self.num_rollouts < 2:
            raise ValueError(f"BiCuRLConfig.num_rollouts (K) must be >= 2 for group advantages, got {self.num_rollouts}")
        if self.patience < 1 or self.kl_tau <= 0:
            raise ValueError(f"BiCuRLConfig needs patience >= 1 and kl_tau > 0, got {self.patience}, {self.kl_tau}")


def run(run_dir: pathlib.Path, config: BiCuRLConfig = BiCuRLConfig()) -> dict:
    """Runs the BiCuRL experiment in `run_dir` and returns its summary (JSON-serialisable)."""
    run_dir = pathlib.Path(run_dir)
    summary = {"config": dataclasses.asdict(config)}
    print("[bat_jax] BiCuRL configuration:")
    for key, value in summary["config"].items():
        print(f"  {key:>22} = {value}")
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True))
    return summary
