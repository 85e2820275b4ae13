"""The rows a BiCuRL round trains on: the run mode's pools, the round view behind its leakage preflight, the KL probe.

Details: docs/design.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from bat_jax.benchmark.stages import E2E
from bat_jax.errors import ConfigValueError
from bat_jax.learn import kl
from bat_jax.learn.batching import pad_batch
from bat_jax.learn.dynamic_sampling import DynamicSamplingConfig
from bat_jax.models.episode import EpisodeBuilder
from bat_jax.policy import Policy
from bat_jax.prompts import PromptFormat
from bat_jax.stage_bank import pools
from bat_jax.stage_bank.bank import BankView
from bat_jax.stage_bank.leakage import HeldOutManifest, preflight
from bat_jax.stage_bank.row import RLRow


def mode_pools(rl_rows: Sequence[RLRow], mode: str, pool_config: pools.PoolConfig
               ) -> tuple[list[RLRow], pools.PoolConfig]:
    """The RL rows and pool config a round of `mode` draws from.

    All rows and `pool_config` for BiCuRL; for the GRPO-E2E baseline only the E2E rows, rewarded by their task
    metric, in the E2E pool alone.
    """
    if mode != "grpo_e2e":
        return list(rl_rows), pool_config
    rows = [dataclasses.replace(row, reward_source="task_metric") for row in rl_rows if row.focus == E2E]
    return rows, dataclasses.replace(pool_config, omit=("target", "mix"))


@dataclasses.dataclass(frozen=True)
class RoundRows:
    """How a run draws each round's rows.

    Attributes:
      mode: the run's mode (`experiment.MODES`; `mode_pools`).
      steps: GRPO steps per round: the pool batches a round view holds.
      pools: the pool proportions and batch size (`stage_bank.pools.PoolConfig`).
      dynamic_sampling: its spare rows per pool (`max_extra_rows` per step when enabled).
      manifest: the held-out manifest every drawn row is checked against.
      load_state: a row's state reference → its sandbox state (`StageBank.load_state`), for the preflight.
    """

    mode: str
    steps: int
    pools: pools.PoolConfig
    dynamic_sampling: DynamicSamplingConfig
    manifest: HeldOutManifest
    load_state: Callable

    def view(self, view: BankView, target: str, round_index: int) -> pools.RoundView:
        """The round's pool batches (and dynamic sampling's spare rows) for target stage `target`.

        They come from bank version `view`, after the leakage preflight of every row they hold.

        Raises:
          stage_bank.leakage.LeakageError: a held-out marker in one of the rows.
        """
        rows, pool_config = mode_pools(view.rl_rows, self.mode, self.pools)
        sampling = self.dynamic_sampling
        spares = sampling.max_extra_rows * self.steps if sampling.enabled else 0
        round_view = pools.build_round_view(rows, target, round_index=round_index, n_batches=self.steps,
                                            config=pool_config, spares_per_pool=spares)
        spare_items = [item for items in round_view.spares.values() for item in items]
        preflight(self.manifest, rows=[item.row for item in round_view.items + spare_items],
                  load_state=self.load_state, source=f"round {round_index} view").raise_if_leaky()
        return round_view

    def check_fits(self, view: BankView, stages: Sequence[str]) -> None:
        """Checks, before SFT, that a round targeting any of `stages` can be drawn from bank version `view`.

        Raises:
          ConfigValueError: a pool such a round draws from is empty, or (without `PoolConfig.refill`) holds fewer
            rows than its batches need, naming the bindings to change.
        """
        rows, config = mode_pools(view.rl_rows, self.mode, self.pools)
        props = config.proportions()
        need = {k: sum(c.get(k, 0) for c in pools.batch_counts(props, config.batch_size, self.steps)) for k in props}
        for stage in stages:
            have = {k: len(v) for k, v in pools.partition_pools(rows, stage).items() if k in props}
            for k, n in have.items():
                where = f"Stage Bank v{view.version}: a round targeting {stage!r} draws pool {k!r}"
                if n == 0:
                    raise ConfigValueError(f"{where}, which has no RL row; build the bank with rows of that focus "
                                           f"(factory.FactoryConfig.foci) or bind pools.PoolConfig.{k} = 0")
                if need[k] > n and not config.refill:
                    raise ConfigValueError(
                        f"{where}, which has {n} RL rows, but its {self.steps} batches (experiment.BiCuRLConfig."
                        f"grpo_steps_per_round) of pools.PoolConfig.batch_size = {config.batch_size} need {need[k]}; "
                        f"bind pools.PoolConfig.refill = True (further passes over the rows) or draw fewer")


def fit_probe(config: kl.PolicyShiftConfig, available: int) -> kl.PolicyShiftConfig:
    """The KL probe's config for a bank version of `available` RL rows: `num_prompts` lowered to them, logged.

    Raises:
      ConfigValueError: no RL row at all.
    """
    if available >= config.num_prompts:
        return config
    if available < 1:
        raise ConfigValueError("the Stage Bank version has no RL row, so no KL probe prompt "
                               "(kl.PolicyShiftConfig.num_prompts); build it with RL rows")
    print(f"[bat_jax] KL probe: {available} prompts, every RL row of the bank version (kl.PolicyShiftConfig."
          f"num_prompts = {config.num_prompts} asks for more)", flush=True)
    return dataclasses.replace(config, num_prompts=available)


def kl_prompts(rows: Sequence[RLRow], policy: Policy, prompt: PromptFormat, config: kl.PolicyShiftConfig
               ) -> tuple[np.ndarray, np.ndarray]:
    """Right-padded prompt ids of up to `num_prompts` Stage Bank RL rows.

    They are the KL probe set: training rows, never held-out ones.
    """
    prompts = []
    for row in list(rows)[: config.num_prompts]:
        messages, tools = prompt.first_messages(row.prompt, row.skill)
        # through the EpisodeBuilder: text in briefs and skills never becomes a control id
        prompts.append(list(EpisodeBuilder(policy.tokenizer, policy.chat_family).start(messages, tools)))
    batch = pad_batch([{"input_ids": np.asarray(p, np.int32), "attention_mask": np.ones(len(p), np.int32)}
                       for p in prompts], multiple=1)
    return batch["input_ids"], batch["attention_mask"]
