"""The acceptance test Accept() of an E2E surrogate (paper Eq. 15), with the λ_validate budget.

The reduction R_λ itself (Eq. 12) is the benchmark's (`StagedBenchmark.reduce_task`): what a smaller task is
depends on what the benchmark's tasks are. Accept() is the same for every benchmark.
"""

from __future__ import annotations

from collections.abc import Sequence

from bat_jax.staged_benchmark.contract import Reduction


def accept(*, booted: bool, turns: int, horizon: int, failed_stages: Sequence[str], passes: int,
           lam: Reduction, leak_hits: int) -> str:
    """Accept(z^E2E) of Eq. 15, plus the λ_validate budget.

    Returns '' when accepted, else the first failed factor as a rejection reason: 'boot_failed', 'too_long' (T̃ > H),
    'check_failed:<stage id>', 'validation_budget' (more passes than λ_validate) or 'leak' (Leak(z) > 0)."""
    if not booted:
        return "boot_failed"
    if turns > horizon:
        return "too_long"
    if failed_stages:
        return f"check_failed:{failed_stages[0]}"
    if passes > lam.validation_passes:
        return "validation_budget"
    if leak_hits:
        return "leak"
    return ""
