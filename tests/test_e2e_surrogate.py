"""Accept() of an E2E surrogate (bat_jax/stage_bank/e2e_surrogate.py, paper Eq. 15) with the λ_validate budget:
accepted only when it booted, fits the horizon, passes every stage check, stays within its validation passes and
leaks nothing; otherwise the first failed factor, in that order."""

import pytest

from bat_jax.stage_bank.e2e_surrogate import accept
from bat_jax.staged_benchmark.contract import Reduction

GOOD = dict(booted=True, turns=24, horizon=24, failed_stages=(), passes=2, lam=Reduction(validation_passes=2),
            leak_hits=0)


def test_a_surrogate_that_meets_every_factor_is_accepted():
    assert accept(**GOOD) == ""  # T̃ = H and passes = λ_validate are still inside


@pytest.mark.parametrize("change, reason", [
    (dict(booted=False, turns=99, leak_hits=3), "boot_failed"),  # the first failed factor wins
    (dict(turns=25), "too_long"),
    (dict(failed_stages=("S3", "S5")), "check_failed:S3"),
    (dict(passes=3), "validation_budget"),
    (dict(leak_hits=1), "leak"),
    (dict(failed_stages=("S2",), passes=5, leak_hits=1), "check_failed:S2"),
])
def test_a_rejection_names_the_first_failed_factor(change, reason):
    assert accept(**{**GOOD, **change}) == reason
