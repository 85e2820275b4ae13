"""The Trajectory record (bat_jax/rollout/trajectory.py): equal-length token arrays, a known finish reason, and
"scored" false only for an infrastructure failure."""

import numpy as np
import pytest

from bat_jax.rollout import trajectory as tj


def _trajectory(n_mask=4, finish=tj.FINISH_MAX_TURNS, **kw):
    ids = np.arange(4, dtype=np.int32)
    return tj.Trajectory("row-1", 2, "S3", ids, np.ones(n_mask, np.int32), np.zeros(4, np.float32), 2, finish,
                         False, 1, 0, 4, **kw)


def test_an_agent_failure_is_scored_and_an_infrastructure_failure_is_not():
    assert _trajectory().scored
    assert _trajectory(agent_error="sandbox died after agent code").scored  # the agent's own failure: scored
    assert not _trajectory(finish=tj.FINISH_SANDBOX_ERROR, infra_error="image missing").scored  # null, not zero


def test_arrays_of_different_lengths_and_unknown_finish_reasons_are_refused():
    with pytest.raises(ValueError, match=r"Trajectory row-1#2: ids 4, loss_mask 3, logprobs 4 must have equal length"):
        _trajectory(n_mask=3)
    with pytest.raises(ValueError, match=r"Trajectory row-1#2: unknown finish_reason 'timeout'"):
        _trajectory(finish="timeout")


def test_the_finish_reasons():
    assert tj.FINISH_REASONS == ("submitted", "no_tool_call", "max_turns", "max_tool_calls", "max_response_tokens",
                                 "max_context", "invalid_turn", "sandbox_error", "engine_error")


def test_the_infrastructure_warning_counts_the_unscored_and_names_the_commonest_reason():
    down = "generation failed: RuntimeError: engine down"
    failed = [_trajectory(finish=tj.FINISH_ENGINE_ERROR, infra_error=e) for e in (down, "sandbox start failed", down)]
    assert tj.infra_warning(failed + [_trajectory()], "GRPO rollouts", "left out of the loss") == (
        f"[bat_jax] warning: 3 GRPO rollouts unscored by infrastructure failures (left out of the loss); 2 of them: "
        f"{down}")
    assert tj.infra_warning([_trajectory(), _trajectory(agent_error="sandbox died")], "cells", "x") is None
    long = tj.infra_warning([_trajectory(finish=tj.FINISH_ENGINE_ERROR, infra_error="x" * 400)], "cells", "x")
    assert long.endswith("1 of them: " + "x" * 297 + "...")
