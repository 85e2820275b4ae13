"""Rollout rewards (bicurl/reward.py) share rebuilt tasks: `TaskCache` rebuilds each distinct provenance once, and
`score_rollouts` (concurrent, cached) returns exactly the rewards of scoring one by one without a cache."""

import dataclasses
import threading

import numpy as np
import pytest

from bat_jax.benchmarks.imaging import heldout
from bat_jax.benchmarks.imaging.benchmark import ImagingBenchmark
from bat_jax.benchmarks.imaging.registry import get_track
from bat_jax.bicurl import reward as row_reward
from bat_jax.bicurl.reward import RewardConfig, RolloutScorer, TaskCache, rollout_reward, score_rollouts, task_key
from doubles import reward_row, reward_trajectory

IMAGING = ImagingBenchmark()


@pytest.fixture(scope="module")
def batch():
    """Two tasks (seeds 3 and 4) x stages S1 / E2E / S2 x 4 rollouts each, as a GRPO batch holds them."""
    rows, trajectories, starts = [], [], []
    for seed in (3, 4):
        task = heldout.training_task(get_track("vqa"), seed, "success", 0)
        for focus in ("S1", "E2E", "S2"):
            for k in range(4):
                rows.append(reward_row(seed, focus))
                trajectories.append(reward_trajectory(task, focus, k))
                starts.append(task.state())
    return rows, trajectories, starts


def test_cached_concurrent_scoring_equals_one_by_one(batch):
    rows, trajectories, starts = batch
    plain = [rollout_reward(r, t, s, IMAGING) for r, t, s in zip(rows, trajectories, starts)]
    cache = TaskCache(IMAGING, 8)
    cached = score_rollouts(rows, trajectories, starts, IMAGING, config=RewardConfig(max_workers=4), tasks=cache)
    assert cached == plain  # same values, same order (RolloutReward is a frozen dataclass: exact equality)
    # seed 3: S1 = mean of its 9 items (brief read, manifest read, plan ...); E2E = 0.5 x (Agentic-weighted stage
    # rewards: only S1 > 0, weight .25) + 0.5 x task, and rollout 2 adds the task metric 1/6
    assert [r.reward for r in plain[:8]] == pytest.approx([1 / 9, 6 / 9, 2 / 9, 4 / 9,
                                                           1 / 72, 6 / 72, 2 / 72 + 1 / 12, 4 / 72])
    assert cache.builds == 2  # 24 rollouts of two tasks


def test_scorer_takes_rollouts_out_of_order(batch):
    """`RolloutScorer` as the agent loop feeds it (positions in the order episodes end): the rewards of scoring
    one by one, in position order; a position given twice, out of range or never given is an error."""
    rows, trajectories, starts = batch
    plain = [rollout_reward(r, t, s, IMAGING) for r, t, s in zip(rows, trajectories, starts)]
    order = list(np.random.default_rng(0).permutation(len(rows)))
    with RolloutScorer(rows, starts, IMAGING, config=RewardConfig(max_workers=3)) as scorer:
        for i in order:
            scorer.submit(int(i), trajectories[i])
        assert scorer.results() == plain
        with pytest.raises(ValueError, match="position 5 .* submitted before"):
            scorer.submit(5, trajectories[5])
        with pytest.raises(ValueError, match="position 24 is out of range"):
            scorer.submit(24, trajectories[0])
    with RolloutScorer(rows[:3], starts[:3], IMAGING) as scorer:
        scorer.submit(1, trajectories[1])
        with pytest.raises(ValueError, match=r"positions \[0, 2\] were never submitted"):
            scorer.results()
    with pytest.raises(ValueError, match="2 rows and 1 start states"):
        RolloutScorer(rows[:2], starts[:1], IMAGING)


def test_the_task_is_built_once_per_distinct_provenance(batch, monkeypatch):
    rows, trajectories, starts = batch
    calls, real = [], row_reward.row_task
    lock = threading.Lock()

    def counting(row, benchmark):
        assert benchmark is IMAGING
        with lock:
            calls.append(task_key(row))
        return real(row, benchmark)

    monkeypatch.setattr(row_reward, "row_task", counting)
    other = reward_row(3, "S1", variant="recovery")  # same seed, other variant: another task
    score_rollouts(rows + [other], trajectories + [trajectories[0]], starts + [starts[0]], IMAGING,
                   config=RewardConfig(max_workers=8))
    assert sorted(calls) == sorted({task_key(rows[0]), task_key(rows[12]), task_key(other)})
    assert task_key(rows[0]) == task_key(rows[4]) != task_key(rows[12])  # S1 and E2E rows of seed 3 share it


def test_the_cache_is_bounded_lru(batch, monkeypatch):
    rows = batch[0]
    cache = TaskCache(IMAGING, maxsize=1)
    first = cache.get(rows[0])
    assert cache.get(rows[1]) is first and cache.builds == 1
    cache.get(rows[12])  # evicts seed 3
    cache.get(rows[0])
    assert cache.builds == 3
    assert first.state().digest() == cache.get(rows[0]).state().digest()


def test_config_errors_name_the_field(batch):
    with pytest.raises(ValueError, match="RewardConfig.max_workers"):
        RewardConfig(max_workers=0)
    with pytest.raises(ValueError, match="RewardConfig.task_cache_size"):
        RewardConfig(task_cache_size=0)
    with pytest.raises(ValueError, match="maxsize"):
        TaskCache(IMAGING, 0)
    rows, trajectories, starts = batch
    with pytest.raises(ValueError, match="2 rows, 1 trajectories"):
        score_rollouts(rows[:2], trajectories[:1], starts[:2], IMAGING)
    assert dataclasses.asdict(RewardConfig()) == {
        "max_workers": 4, "task_cache_size": 32,
        "decode": {"max_json_bytes": 1 << 20, "max_json_depth": 32, "max_text_bytes": 1 << 20,
                   "max_array_bytes": 64 << 20, "max_array_dims": 8}}
