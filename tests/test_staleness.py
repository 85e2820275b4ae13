"""Bounded-staleness rules (bat_jax/learn/staleness.py) on hand-built groups: versions → trained / dropped /
evicted / aborted, and the round's counts."""

import numpy as np
import pytest

from bat_jax.learn import staleness as st
from bat_jax.rollout.trajectory import Trajectory


def verdict(versions, current, infra=None, **config):
    infra = infra or [False] * len(versions)
    return st.judge_group(versions, [0] * len(versions), infra, current, st.StalenessConfig(**config))


def test_a_group_is_as_stale_as_its_oldest_rollouts_first_turn():
    # rollouts began on 3, 4 and 5 (later turns on newer weights do not count): at 5 the group is 2 versions old
    versions = [[3, 4, 5], [4], [5, 5]]
    assert st.staleness([3, 4, 5], 5) == 2
    assert verdict(versions, 5, max_staleness=1) == st.Verdict("stale", 2)
    assert verdict(versions, 5, max_staleness=2) == st.Verdict("train", 2)
    assert verdict(versions, 6, max_staleness=2) == st.Verdict("stale", 3)
    assert verdict([[7], [7]], 7, max_staleness=0) == st.Verdict("train", 0)


def test_a_rollout_without_turns_uses_its_fallback_version():
    assert st.began([], 4) == 4 and st.began([2, 3], 4) == 2
    got = st.judge_group([[], [5]], [3, 0], [False, False], 5, st.StalenessConfig(max_staleness=1))
    assert got == st.Verdict("stale", 2)


def test_a_version_from_the_future_is_refused():
    with pytest.raises(ValueError, match="version 6, after the current version 5"):
        st.staleness([4, 6], 5)


def test_infrastructure_failure_evicts_before_the_bound_and_abort_requeues_a_crossed_sync():
    fresh = [[5], [5], [5]]
    assert verdict(fresh, 5, infra=[False, True, False], max_staleness=1) == st.Verdict("failed", 0)
    assert verdict(fresh, 5, infra=[False, True, False], max_staleness=1, evict_failed=False).action == "train"
    crossed = [[4, 5], [5], [5]]
    assert verdict(crossed, 5, max_staleness=1, on_sync="abort") == st.Verdict("aborted", 1)
    assert verdict(crossed, 5, max_staleness=1, on_sync="continue") == st.Verdict("train", 1)
    assert st.crossed_sync([4, 5]) and not st.crossed_sync([5, 5]) and not st.crossed_sync([])


def test_the_round_counts_hold_hand_computed_values():
    counts = st.StaleCounts()
    for action, lag in [("train", 0), ("train", 1), ("stale", 3), ("failed", 0), ("train", 2), ("aborted", 1),
                        ("train", 1)]:
        counts.count(st.Verdict(action, lag))
    counts.refilled = 3
    assert counts.summary() == {"groups_dropped_stale": 1, "groups_evicted": 1, "groups_aborted": 1,
                                "groups_refilled": 3, "staleness_mean": 1.0, "staleness_max": 2}
    assert st.StaleCounts().summary()["staleness_mean"] is None
    with pytest.raises(ValueError, match="unknown verdict 'kept'"):
        counts.count(st.Verdict("kept", 0))


def test_config_refuses_bad_values_naming_the_field():
    with pytest.raises(ValueError, match="max_staleness must be >= 0"):
        st.StalenessConfig(max_staleness=-1)
    with pytest.raises(ValueError, match="on_sync must be one of"):
        st.StalenessConfig(on_sync="pause")


def test_a_trajectory_records_the_version_it_began_on():
    empty = np.zeros(0, np.int32)
    t = Trajectory(state_id="s", episode=0, stage="S1", ids=empty, loss_mask=empty, logprobs=np.zeros(0, np.float32),
                   prompt_len=0, finish_reason="submitted", truncated=False, num_turns=2, num_tool_calls=1,
                   response_tokens=0, weight_version=4, turn_versions=(3, 4))
    assert t.began_version == 3
    assert Trajectory(**{**t.__dict__, "turn_versions": ()}).began_version == 4
