"""One round's GRPO block with bounded staleness: rollouts of later steps run while the learner trains.

`run_grpo_block` is what a round calls: with `GRPOBlockConfig.staleness.max_staleness == 0` it is
`grpo_round.grpo_block`, the synchronous block, unchanged; with s > 0 it is `async_grpo_block`:

Details: docs/design.md.
"""

from __future__ import annotations

import collections
import concurrent.futures
import copy
import dataclasses
from typing import Any

from bat_jax.bicurl import grpo_round as gr
from bat_jax.bicurl.hosts import OneHost
from bat_jax.bicurl.reward import TaskCache
from bat_jax.bicurl.round_journal import RoundJournal
from bat_jax.learn.dynamic_sampling import SpareRows
from bat_jax.learn.learner import Learner
from bat_jax.learn.staleness import StaleCounts, judge_group
from bat_jax.ledger import GRPOStats
from bat_jax.rollout.agent_loop import AgentLoop
from bat_jax.rollout.weight_gate import WeightGate
from bat_jax.stage_bank import pools
from bat_jax.stage_bank.bank import StageBank
from bat_jax.staged_benchmark.contract import StagedBenchmark
from bat_jax.verify.judge import RubricJudge


def run_grpo_block(learner: Learner, loop: AgentLoop, bank: StageBank, round_view: pools.RoundView,
                   block: gr.GRPOBlockConfig, benchmark: StagedBenchmark, seed: int,
                   judge: RubricJudge | None = None, journal: RoundJournal | None = None,
                   hosts: OneHost | None = None) -> GRPOStats:
    """The round's GRPO block, synchronous or bounded-staleness.

    It is `grpo_round.grpo_block` when `block.staleness.max_staleness == 0`, else `async_grpo_block` (module docstring);
    `journal` keeps what it rolls out (`bicurl/round_journal.py`); `hosts` splits the rollouts over the run's processes.
    """
    if block.staleness.max_staleness == 0:
        return gr.grpo_block(learner, loop, bank, round_view, block, benchmark, seed, judge, journal=journal,
                             hosts=hosts)
    return async_grpo_block(learner, loop, bank, round_view, block, benchmark, seed, judge, journal=journal,
                            hosts=hosts)


@dataclasses.dataclass
class _Slot:
    """Row `index` of pool batch `batch` and what happened to it.

    The item rolled out now, how many times it was (the wave of its seed), its extra rows spent (dynamic sampling) and,
    once settled, the group trained (None: left empty)."""

    batch: int
    index: int
    item: Any
    wave: int = 0
    future: concurrent.futures.Future | None = None
    group: tuple | None = None
    settled: bool = False


def _roll_group(loop: AgentLoop, bank: StageBank, item: pools.RoundItem, index: int, block: gr.GRPOBlockConfig,
                seed: int, judge: RubricJudge | None, tasks: TaskCache) -> tuple[list, list]:
    """(trajectories, `RolloutReward`s) of the K episodes of one row, sampled with `seed` as row `index`.

    The row is row `index` of its batch: the same draws as `grpo_round.rollouts` over the batch; a loop without
    `run_episodes`, e.g. Ray rollouts, samples it as row 0 of its own call."""
    start = bank.load_state(item.row.state)
    request = gr.rl_request(item.row, start, item.round_state_id, block.prompt)
    k_rollouts = block.grpo.sampling.group_size
    with gr.RolloutScorer([item.row] * k_rollouts, [start] * k_rollouts, tasks.benchmark, judge, block.reward,
                          tasks) as scorer:
        if hasattr(loop, "run_episodes"):
            trajs = loop.run_episodes([(request, index, k) for k in range(k_rollouts)], seed=seed,
                                      on_trajectory=scorer.submit)
        else:
            trajs = loop.run([request], seed=seed, on_trajectory=scorer.submit)
        return trajs, scorer.results()


def gated(loop: AgentLoop) -> AgentLoop:
    """`loop` with its engine behind a `WeightGate` (a shallow copy; the engine itself is shared)."""
    if isinstance(loop.engine, WeightGate):
        return loop
    out = copy.copy(loop)
    out.engine = WeightGate(loop.engine)
    return out


def async_grpo_block(learner: Learner, loop: AgentLoop, bank: StageBank, round_view: pools.RoundView,
                     block: gr.GRPOBlockConfig, benchmark: StagedBenchmark, seed: int,
                     judge: RubricJudge | None = None, journal: RoundJournal | None = None,
                     hosts: OneHost | None = None) -> GRPOStats:
    """Runs one round's GRPO block with bounded staleness (module docstring) and returns what it did.

    Each group goes through `journal` (`bicurl/round_journal.py`: a resumed round reuses the groups it finished before
    the kill and rolls out the rest; None keeps nothing).

    Raises: whatever a rollout, scorer or learner step raises (the rollouts in flight are waited for first).
    """
    rules = block.staleness
    s = rules.max_staleness
    batches = [list(b) for b in round_view.batches]
    run = gr.BlockRun(learner, round_view, block, benchmark, hosts)
    hosts = run.hosts  # OneHost when none was given
    loop = gated(loop)
    spares = SpareRows(round_view.spares)
    counts = StaleCounts()
    extra = collections.Counter()  # batch → replacement rows for lack of signal (dynamic sampling)
    slots = [[_Slot(b, i, item) for i, item in enumerate(batch)] for b, batch in enumerate(batches)]
    workers = rules.concurrent_groups or max(1, max((len(b) for b in batches), default=1) * (1 + s))
    admitted = 0  # batches whose work has been handed to the pool
    journal = journal if journal is not None else RoundJournal(None)
    base_version = 0  # the engine's version at step 0's sync (the journal's versions count from it)

    def submit(slot: _Slot) -> None:
        """Rolls the slot out on this process when it is in this process's share of its batch (all with one)."""
        if slot.index not in hosts.share(len(batches[slot.batch])):
            return
        group_seed, item = gr.wave_seed(seed, slot.batch, slot.wave), slot.item
        slot.future = pool.submit(
            journal.rolled_out, f"b{slot.batch:04d}-i{slot.index:03d}-w{slot.wave:03d}", [item.round_state_id],
            group_seed, base_version,
            lambda: _roll_group(loop, bank, item, slot.index, block, group_seed, judge, run.tasks))

    def refill(slot: _Slot, same_row: bool) -> bool:
        """Re-queues the slot (its own row, or a spare of its pool); False when no refill is left."""
        if counts.refilled >= rules.max_refills:
            return False
        item = slot.item if same_row else spares.take(slot.item.pool)
        if item is None:
            return False
        counts.refilled += 1
        slot.item, slot.wave = item, slot.wave + 1
        submit(slot)
        return True

    def settle(slot: _Slot, current: int, result: tuple[list, list]) -> None:
        """Judges a finished group at version `current`: trained, or dropped and refilled.

        Main thread; with several processes every process settles every group, from the same gathered results.
        """
        trajs, scored = result
        slot.future = None
        run.tally.groups_drawn += 1
        rewards = [r.reward for r in scored]
        run.count_rollouts(trajs, scored, [slot.item] * len(scored),
                           first_wave=slot.batch == 0 and slot.wave == 0)
        verdict = judge_group([getattr(t, "turn_versions", ()) for t in trajs],
                              [getattr(t, "weight_version", 0) for t in trajs],
                              [bool(getattr(t, "infra_error", "")) for t in trajs], current, rules)
        if verdict.action != "train":
            counts.count(verdict)
            if not refill(slot, same_row=verdict.action == "aborted"):
                slot.settled = True
            return
        ds = block.dynamic_sampling
        if ds.enabled and not ds.keeps(rewards):
            run.tally.groups_dropped += 1
            if extra[slot.batch] < ds.max_extra_rows and spares.available(slot.item.pool):
                extra[slot.batch] += 1
                slot.item, slot.wave = spares.take(slot.item.pool), slot.wave + 1
                submit(slot)
            else:
                slot.settled = True
            return
        counts.count(verdict)
        slot.group, slot.settled = (trajs, scored), True

    with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="grpo-group") as pool:
        try:
            for b in range(len(batches)):
                current = run.sync(loop)
                base_version = int(current) if b == 0 else base_version
                while admitted < len(batches) and admitted <= b + s:  # admission: batches up to b + s
                    for slot in slots[admitted]:
                        submit(slot)
                    admitted += 1
                while unsettled := [slot for slot in slots[b] if not slot.settled]:
                    mine = {slot.index: slot.future for slot in unsettled if slot.future is not None}
                    done = hosts.finished(mine, f"step {b}'s groups")
                    for slot in unsettled:
                        if slot.index in done:
                            settle(slot, current, done[slot.index])
                run.train_groups([(slot.item.pool, *slot.group) for slot in slots[b] if slot.group is not None])
        finally:  # an error: let the groups in flight end before their sandboxes and scorers go
            for row in slots:
                for slot in row:
                    if slot.future is not None:
                        slot.future.cancel()
    return run.finish(loop, bank, round_view, judge, seed, **counts.summary())
