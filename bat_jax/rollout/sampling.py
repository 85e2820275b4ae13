"""The run's one sampling configuration: K rollouts per state and the transform they are drawn with.

Details: docs/design.md.
"""

from __future__ import annotations

import dataclasses

from bat_jax.rollout.engine import SamplingParams


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """K and the sampling transform of a run's rollouts (paper App. A.7, Table 8).

    Attributes:
      group_size: K, rollouts per RL row: the agent loop's episodes per request and GRPO's group (paper: 4).
      temperature: T >= 0; 0 is greedy (paper and the released code: 0.7).
      top_p: nucleus mass in (0, 1]; 1 disables it.
      top_k: keep the k most likely tokens; 0 disables it.
    Raises:
      ValueError: naming the field, for a value out of its range.
    """

    group_size: int = 4
    temperature: float = 0.7
    top_p: float = 1.0
    top_k: int = 0

    def __post_init__(self):
        if self.group_size < 1:
            raise ValueError(f"SamplingConfig.group_size must be >= 1, got {self.group_size}")
        if not self.temperature >= 0.0:
            raise ValueError(f"SamplingConfig.temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"SamplingConfig.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"SamplingConfig.top_k must be >= 0 (0 = off), got {self.top_k}")

    @property
    def transform(self) -> tuple[float, float, int]:
        """(temperature, top_p, top_k): the arguments of `engine.processed_logprobs` the rollouts were drawn with."""
        return (self.temperature, self.top_p, self.top_k)

    def params(self, max_new_tokens: int, stop_token_ids: tuple[int, ...] = ()) -> SamplingParams:
        """The `SamplingParams` of one engine call under this transform."""
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                              max_new_tokens=max_new_tokens, stop_token_ids=stop_token_ids)
