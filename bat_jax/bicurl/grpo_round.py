"""One round's GRPO block (paper Section 2.2, Eq. 16–19).

Rollouts of the round view's batches, rubric rewards, optional dynamic sampling and rollout correction,
`GRPOConfig.epochs` optimizer steps per batch.

Details: docs/design.md.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
from collections.abc import Sequence

import numpy as np
from tqdm.auto import tqdm

from bat_jax.benchmark.items import ItemRates
from bat_jax.bicurl.hosts import OneHost
from bat_jax.bicurl.reward import RewardConfig, RolloutScorer, TaskCache
from bat_jax.bicurl.round_journal import RoundJournal
from bat_jax.errors import ConfigValueError
from bat_jax.learn import grpo, rollout_correction
from bat_jax.learn.dynamic_sampling import DynamicSamplingConfig, SpareRows, fill_batch, has_signal
from bat_jax.learn.batching import grpo_bucket, pad_batch
from bat_jax.learn.learner import Learner
from bat_jax.learn.optim import GRPO_OPTIMIZER, OptimizerConfig
from bat_jax.learn.staleness import StalenessConfig
from bat_jax.ledger import GRPOStats
from bat_jax.prompts import PromptFormat, rl_request
from bat_jax.rollout.agent_loop import AgentLoop, AgentLoopConfig
from bat_jax.rollout.trajectory import infra_warning
from bat_jax.stage_bank import pools
from bat_jax.stage_bank.bank import StageBank
from bat_jax.staged_benchmark.contract import StagedBenchmark
from bat_jax.verify.judge import RubricJudge

SHIFT_KEYS = ("logp_shift_pos", "logp_shift_neg", "token_kl")


@dataclasses.dataclass(frozen=True)
class GRPOBlockConfig:
    """What one GRPO block reads (gin: `experiment.Components.block`; its fields bound on their own dataclasses).

    Attributes:
      grpo: the objective (`learn/grpo.GRPOConfig`; rollout correction through its `tis_cap` / `seq_ratio_range`);
        construction applies `grpo.for_staleness` (TIS on at cap 2.0 when `staleness` allows s > 0 and none is bound).
      optimizer: the GRPO optimizer, fresh each block.
      micro_batches: gradient accumulation inside one step (the batch is padded to devices × micro_batches rows).
      reward: scoring threads and the round's task cache (`bicurl/reward.RewardConfig`).
      dynamic_sampling: groups without reward variance dropped and replaced (`learn/dynamic_sampling.py`).
      staleness: bounded-staleness rollouts (`learn/staleness.py`; max_staleness 0: this synchronous block, s > 0:
        `bicurl/async_block.py`).
      max_context_tokens, max_response_tokens, prompt: what the run's agent loop and prompts fix (`for_run`, never
        bound): the longest rollout (batches are padded to their length bucket below it), the response budget
        (Dr.GRPO's constant C when `grpo.loss_scale_factor` is None: `objective`), the rollout requests' prompts.
    """

    grpo: grpo.GRPOConfig = grpo.GRPOConfig()
    optimizer: OptimizerConfig = GRPO_OPTIMIZER
    micro_batches: int = 4
    reward: RewardConfig = RewardConfig()
    dynamic_sampling: DynamicSamplingConfig = DynamicSamplingConfig()
    staleness: StalenessConfig = StalenessConfig()
    max_context_tokens: int = 12288
    max_response_tokens: int = 16384
    prompt: PromptFormat = PromptFormat()

    def for_run(self, agent: AgentLoopConfig, prompt: PromptFormat) -> GRPOBlockConfig:
        """This block with the budgets of the run's agent loop and its prompts.

        Raises:
          ConfigValueError: one of them bound on this config (they are the agent loop's bindings).
        """
        default = GRPOBlockConfig()
        bound = [name for name in ("max_context_tokens", "max_response_tokens", "prompt")
                 if getattr(self, name) != getattr(default, name)]
        if bound:
            raise ConfigValueError(f"grpo_round.GRPOBlockConfig.{bound[0]} is set by the run (the agent loop's budgets "
                                   "and the benchmark's prompts): bind agent_loop.AgentLoopConfig instead")
        return dataclasses.replace(self, max_context_tokens=agent.max_context_tokens,
                                   max_response_tokens=agent.max_response_tokens, prompt=prompt)

    def __post_init__(self):
        object.__setattr__(self, "grpo", grpo.for_staleness(self.grpo, self.staleness.max_staleness))

    @property
    def max_staleness(self) -> int:
        """s: weight versions a trained rollout may have begun before the learner's (0 = synchronous)."""
        return self.staleness.max_staleness

    @property
    def objective(self) -> grpo.GRPOConfig:
        """`grpo` with Dr.GRPO's constant C set.

        C is `loss_scale_factor`, or else the response budget (verl's default: the response width its rollouts are
        padded to, `response_length`)."""
        if self.grpo.loss_agg != "seq-mean-token-sum-norm" or self.grpo.loss_scale_factor is not None:
            return self.grpo
        return dataclasses.replace(self.grpo, loss_scale_factor=float(self.max_response_tokens))


def grpo_block(learner: Learner, loop: AgentLoop, bank: StageBank, round_view: pools.RoundView, block: GRPOBlockConfig,
               benchmark: StagedBenchmark, seed: int, judge: RubricJudge | None = None,
               journal: RoundJournal | None = None, hosts: OneHost | None = None) -> GRPOStats:
    """Runs one round's GRPO block on `learner` and returns what it did (`ledger.GRPOStats`).

    Rollouts are scored by `benchmark`'s rule (`StagedBenchmark.score_episode`). The learner's params become the
    block's last state; unscored rollouts (reward None) leave the loss. The step's behaviour logprobs are the
    learner's by default (`GRPOConfig.old_logprobs`): the round-start reference pass while no step has been taken,
    one more pass after. The round's learner-vs-engine metrics (`GRPOStats.rollout_mismatch`) cover every trained
    batch with recomputed logprobs, the first one in bypass mode. Each wave of rollouts goes through `journal`
    (`bicurl/round_journal.py`: a resumed round reuses the waves it finished before the kill and rolls out the
    rest; None keeps nothing). `hosts` (default: one process) splits each wave's episodes over the run's processes.
    """
    journal = journal if journal is not None else RoundJournal(None)
    base_version = 0  # the engine's version at the block's first sync (the journal's versions count from it)
    run = BlockRun(learner, round_view, block, benchmark, hosts)
    spares = SpareRows(round_view.spares)
    k_rollouts = block.grpo.sampling.group_size
    for b, batch in enumerate(tqdm(round_view.batches, desc="GRPO", unit="step")):
        version = run.sync(loop)
        base_version = int(version or 0) if b == 0 else base_version
        waves = itertools.count()

        def roll(items, b=b, waves=waves):  # K rollouts per item, scored: one wave of the batch, its own seed
            wave = next(waves)
            trajs, scored = journal.rolled_out(
                f"sync-b{b:04d}-w{wave:03d}", [item.round_state_id for item in items], wave_seed(seed, b, wave),
                base_version,
                lambda: rollouts(loop, bank, items, block, wave_seed(seed, b, wave), judge, run.tasks, run.hosts))
            run.count_rollouts(trajs, scored, [item for item in items for _ in range(k_rollouts)],
                               first_wave=b == 0 and wave == 0)
            return [(trajs[i * k_rollouts:(i + 1) * k_rollouts], scored[i * k_rollouts:(i + 1) * k_rollouts])
                    for i in range(len(items))]

        filled = fill_batch(list(batch), roll, lambda result: [s.reward for s in result[1]], spares,
                            block.dynamic_sampling)
        run.tally.groups_drawn += filled.drawn
        run.tally.groups_dropped += filled.dropped
        run.train_groups([(item.pool, trajs, scored) for item, (trajs, scored) in filled.groups])
    return run.finish(loop, bank, round_view, judge, seed)


@dataclasses.dataclass
class BlockTally:
    """What one GRPO block counts while it runs, for its `ledger.GRPOStats`.

    Attributes:
      rewards: every scored reward drawn (dropped groups' too); `unscored`, `agent_failed`, `rollouts`: counts of the
        rollouts drawn (`rollout_counts`); `version`: the reward version they were scored under; `items`: (track,
        rubric item results) of each scored rollout.
      before: the first batch's first-wave rewards (its own rows, before any update): the pool reward before.
      mismatch: learner-vs-engine metrics of each trained batch (`behaviour_logprobs`).
      trained_pools: pool → groups trained.
      groups_with_variance, groups_scored, groups_drawn, groups_dropped, groups_trained: the GRPOStats group counts.
      first: the first trained host batch (None while none has trained): where the update's shift is measured.
      failed: the rollouts drawn that infrastructure failures left unscored, for the round's warning line
        (`infra_warning`).
    """

    rewards: list = dataclasses.field(default_factory=list)
    unscored: int = 0
    agent_failed: int = 0
    rollouts: int = 0
    version: str = ""
    items: list = dataclasses.field(default_factory=list)
    before: list = dataclasses.field(default_factory=list)
    mismatch: list = dataclasses.field(default_factory=list)
    trained_pools: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    groups_with_variance: int = 0
    groups_scored: int = 0
    groups_drawn: int = 0
    groups_dropped: int = 0
    groups_trained: int = 0
    first: dict | None = None
    failed: list = dataclasses.field(default_factory=list)


class BlockRun:
    """The learner's side of one GRPO block, shared by the synchronous and the bounded-staleness block.

    Holds the block's jitted step and train state (a fresh optimizer), the KL reference (the round-start policy θ̄_r,
    Eq. 19), the round's task cache and the block's `BlockTally`. `sync` hands the current weights to an engine,
    `count_rollouts` tallies a wave of scored rollouts, `train_groups` trains one step's groups, `finish` adopts the
    last state and writes the round's record.
    """

    def __init__(self, learner: Learner, round_view: pools.RoundView, block: GRPOBlockConfig,
                 benchmark: StagedBenchmark, hosts: OneHost | None = None):
        self.learner, self.block, self.cfg = learner, block, block.objective
        self.hosts = hosts or OneHost()
        self.step_fn, self.state = learner.grpo_block(self.cfg, block.optimizer,
                                                      total_steps=len(round_view.batches) * self.cfg.epochs,
                                                      num_micro_batches=block.micro_batches)
        self.ref_params = learner.params  # KL reference: the round-start policy θ̄_r (Eq. 19)
        self.tasks = TaskCache(benchmark, block.reward.task_cache_size)  # the round's rebuilt tasks, shared
        self.tally = BlockTally()

    def sync(self, loop: AgentLoop) -> int:
        """Makes the train state's parameters the learner's and the engine's; returns the engine's new version."""
        self.learner.params = self.state.params
        return loop.engine.update_weights(self.learner.sync_model(self.state.params))

    def count_rollouts(self, trajectories: Sequence, scored: Sequence, items: Sequence[pools.RoundItem],
                       first_wave: bool) -> None:
        """Tallies one wave of scored rollouts.

        `items[i]` is rollout i's round item; `first_wave`: the first batch's own rows before any update, whose
        rewards are the pool reward before.
        """
        tally = self.tally
        rewards = [s.reward for s in scored]
        n_unscored, n_agent_failed = rollout_counts(trajectories, rewards)
        tally.unscored += n_unscored
        tally.agent_failed += n_agent_failed
        tally.rollouts += len(rewards)
        tally.failed += [t for t in trajectories if getattr(t, "infra_error", "")]
        tally.rewards += [r for r in rewards if r is not None]
        tally.version = scored[0].version if scored else tally.version
        tally.items += [(item.row.provenance.track, s.items) for item, s in zip(items, scored)
                        if s.reward is not None and s.items]
        if first_wave:
            tally.before.extend(r for r in rewards if r is not None)

    def train_groups(self, groups: Sequence[tuple[str, Sequence, Sequence]]) -> None:
        """Trains one step on `groups`, each (pool, K trajectories, their `RolloutReward`s).

        The host batch, the round-start reference logprobs, group advantages, the ratio's behaviour logprobs
        (`behaviour_logprobs`), then `GRPOConfig.epochs` optimizer steps. No groups (every one dropped, none
        replaced): nothing trains.
        """
        learner, cfg, tally = self.learner, self.cfg, self.tally
        tally.groups_trained += len(groups)
        tally.trained_pools.update(pool for pool, _, _ in groups)
        trajectories = [t for _, trajs, _ in groups for t in trajs]
        rewards = [s.reward for _, _, scored in groups for s in scored]
        k, n = group_variance(rewards, [t.state_id for t in trajectories])
        tally.groups_with_variance, tally.groups_scored = tally.groups_with_variance + k, tally.groups_scored + n
        if not trajectories:
            return
        host = batch_rows(learner, trajectories, self.block)
        host["ref_logprobs"] = learner.logprobs(self.ref_params, host, cfg)
        ids = [t.state_id for t in trajectories] + [f"pad-{i}" for i in range(len(host["input_ids"]) - len(rewards))]
        host = grpo.with_advantages(host, rewards + [None] * (len(ids) - len(rewards)), ids, cfg)
        tally.mismatch += behaviour_logprobs(learner, host, cfg, self.state.params, at_round_start=tally.first is None)
        tally.first = host if tally.first is None else tally.first
        for _ in range(cfg.epochs):
            self.state, _ = self.step_fn(self.state, host)

    def finish(self, loop: AgentLoop, bank: StageBank, round_view: pools.RoundView, judge: RubricJudge | None,
               seed: int, **extra) -> GRPOStats:
        """The round's GRPO record, after its last update.

        `extra`: further GRPOStats fields (the bounded-staleness counts). The learner adopts the last train state and syncs it to the engine, which rolls out the round's first pool
        batch again (same rows, same seed as before the updates): the pool reward after. The log-probability shift
        is measured on the first trained batch's own rollouts (none trained: None).
        """
        learner, cfg, tally = self.learner, self.cfg, self.tally
        warning = infra_warning(tally.failed, "GRPO rollouts", "left out of the loss")
        if warning:  # otherwise only a count in the report: say why
            self.hosts.primary_only(lambda: print(warning, flush=True))
        learner.adopt(self.state)
        first = tally.first
        if first is not None:
            shift = grpo.update_shift(first["ref_logprobs"], learner.logprobs(learner.params, first, cfg),
                                      first["loss_mask"], first["advantages"])
        else:
            shift = dict.fromkeys(SHIFT_KEYS, float("nan"))
        loop.engine.update_weights(learner.sync_model(learner.params))
        _, probe = rollouts(loop, bank, round_view.batches[0], self.block, seed * 100, judge, self.tasks, self.hosts)
        after = [s.reward for s in probe if s.reward is not None]
        return GRPOStats(
            rollouts=tally.rollouts, unscored=tally.unscored, agent_failed=tally.agent_failed,
            reward_mean=_mean(tally.rewards), reward_version=tally.version or "none",
            pool_reward_before=_mean(tally.before), pool_reward_after=_mean(after),
            trained_pool_counts=dict(tally.trained_pools),
            update_logp_shift_pos=_none_if_nan(shift["logp_shift_pos"]),
            update_logp_shift_neg=_none_if_nan(shift["logp_shift_neg"]),
            update_token_kl=_none_if_nan(shift["token_kl"]),
            rollout_mismatch=rollout_correction.merge_metrics(tally.mismatch) or None,
            judge={k: float(v) for k, v in judge.stats().items()} if judge is not None else None,
            items=ItemRates.tally(tally.items).to_dict() or None, groups_with_variance=tally.groups_with_variance,
            groups_scored=tally.groups_scored, groups_drawn=tally.groups_drawn, groups_dropped=tally.groups_dropped,
            groups_trained=tally.groups_trained, **extra)


def _mean(values: Sequence[float]) -> float | None:
    """Mean of `values`; None when there are none (nothing scored)."""
    return float(np.mean(values)) if len(values) else None


def _none_if_nan(value: float) -> float | None:
    """`value`, or None when it is NaN (no batch trained): the ledger holds no NaN."""
    return None if value != value else float(value)


def behaviour_logprobs(learner: Learner, host: dict, cfg: grpo.GRPOConfig, params, at_round_start: bool
                       ) -> list[dict[str, float]]:
    """Sets the ratio's behaviour logprobs of a host batch in place and returns its learner-vs-engine metrics.

    `host['old_logprobs']` holds the engine's logprobs as sampled. With `cfg.old_logprobs == 'recompute'` they
    become the learner's under `params` (the parameters the batch was sampled with): the round-start reference
    pass `host['ref_logprobs']` while `at_round_start` (no step taken yet, so the same parameters), else one more
    learner pass. With rollout correction they also give the importance weights and the rollouts kept
    (`rollout_correction.correct`). Returns `[metrics]` of `correct` when the learner's logprobs of the batch are at
    hand (recompute mode, or the round start in bypass mode), else `[]`.
    """
    engine_logprobs = host["old_logprobs"]
    if cfg.old_logprobs == "bypass":  # the engine's logprobs stay the ratio's denominator
        if not at_round_start:
            return []
        return [rollout_correction.correct(host["ref_logprobs"], engine_logprobs, host["loss_mask"], tis_cap=None,
                                           seq_ratio_range=None)[2]]
    learned = host["ref_logprobs"] if at_round_start else learner.logprobs(params, host, cfg)
    weights, keep, metrics = rollout_correction.correct(
        learned, engine_logprobs, host["loss_mask"], tis_cap=cfg.tis_cap, seq_ratio_range=cfg.seq_ratio_range,
        convention=cfg.seq_ratio_convention)
    host["old_logprobs"] = learned
    if cfg.rollout_correction:  # the engine's logprobs weigh the tokens; rollouts out of the bounds leave the loss
        host.update(is_weights=weights, loss_mask=host["loss_mask"] * keep[:, None].astype(host["loss_mask"].dtype))
    return [metrics]


def wave_seed(seed: int, batch: int, wave: int) -> int:
    """Sampling seed of one wave of rollouts, an int in [0, 2**31).

    Wave 0 of batch `batch` is ``seed * 100 + batch`` (the batch seed of a run without dynamic sampling). Replacement
    waves take a seed derived from (seed, batch, wave) by NumPy's `SeedSequence`, so no wave repeats another batch's,
    round's or run seed's draws."""
    if wave == 0:
        return seed * 100 + batch
    return int(np.random.SeedSequence([seed, batch, wave]).generate_state(1)[0] & 0x7FFFFFFF)


def batch_rows(learner: Learner, trajectories: Sequence, block: GRPOBlockConfig) -> dict[str, np.ndarray]:
    """The host batch of `trajectories` (input_ids, attention_mask, loss_mask, old_logprobs `[B, T]`).

    B is padded up to a multiple of devices × micro-batches rows, T to the longest rollout's `grpo_bucket` (not the next
    power of two). With dynamic sampling B varies between batches, so the step may compile once per padded size.

    Raises:
      AssertionError: a rollout longer than `block.max_context_tokens` (the longest the step is compiled for; the agent
        loop never makes one), naming its state id, episode, length and finish reason.
    """
    for t in trajectories:
        if len(t.ids) > block.max_context_tokens:
            raise AssertionError(f"GRPO batch: rollout {t.state_id} episode {t.episode} has {len(t.ids)} tokens, more "
                                 f"than max_context_tokens={block.max_context_tokens} (finish {t.finish_reason!r}); "
                                 "the learner's shapes do not allow it")
    rows = [{"input_ids": t.ids, "attention_mask": np.ones_like(t.ids), "loss_mask": t.loss_mask,
             "old_logprobs": t.logprobs} for t in trajectories]
    longest = max(len(t.ids) for t in trajectories)
    return pad_batch(rows, multiple=int(np.prod(learner.mesh.devices.shape)) * block.micro_batches,
                     pad_to=grpo_bucket(longest, block.max_context_tokens))


def rollouts(loop: AgentLoop, bank: StageBank, batch: Sequence[pools.RoundItem], block: GRPOBlockConfig, seed: int,
             judge: RubricJudge | None, tasks: TaskCache, hosts: OneHost):
    """(trajectories, `RolloutReward`s) of K rollouts per item of one pool batch, sampled with `seed`.

    Each is scored as soon as its episode ends, concurrently with the others' generation (`block.reward` threads), tasks
    rebuilt through `tasks`. Both lists hold K consecutive entries per item, in the batch's order."""
    starts = {item.round_state_id: bank.load_state(item.row.state) for item in batch}
    requests = [rl_request(item.row, starts[item.round_state_id], item.round_state_id, block.prompt)
                for item in batch]
    k_rollouts = block.grpo.sampling.group_size
    per_rollout = [item for item in batch for _ in range(k_rollouts)]  # the loop's order: K a row
    with RolloutScorer([item.row for item in per_rollout], [starts[item.round_state_id] for item in per_rollout],
                       tasks.benchmark, judge, block.reward, tasks) as scorer:
        # scored as they finish; with several processes each rolls out and scores its share, then all gather
        return hosts.scored_rollouts(loop, requests, seed, scorer)


def group_variance(rewards, groups) -> tuple[int, int]:
    """(groups with reward variance, groups with at least two scored rewards) of one batch.

    `rewards[i]` (None = unscored) belongs to group `groups[i]`. Variance is verl's filter rule,
    `dynamic_sampling.has_signal` (np.std > 0: a group equal up to round-off counts, as verl keeps it)."""
    by_group: dict = {}
    for reward, group in zip(rewards, groups, strict=True):
        by_group.setdefault(group, []).append(reward)
    scored = [v for v in by_group.values() if sum(r is not None for r in v) >= 2]
    return sum(has_signal(v) for v in scored), len(scored)


def rollout_counts(trajectories, rewards) -> tuple[int, int]:
    """(unscored, agent_failed) rollout counts of one batch.

    Unscored: rollouts with reward None (infrastructure: unscored, out of the loss). Agent-failed: scored rollouts whose
    sandbox the agent's own code killed or hung (`Trajectory.agent_error`). The two never overlap: an agent-failed
    rollout that is unscored for another reason (e.g. the judge down) counts as unscored only."""
    unscored = sum(r is None for r in rewards)
    agent_failed = sum(bool(t.agent_error) and r is not None for t, r in zip(trajectories, rewards, strict=True))
    return unscored, agent_failed
