"""launch/evaluate_rounds.py: its table of each checkpoint's final evaluation, paired with step 0, against hand values."""

import pytest

from bat_jax.benchmark.scoring import Cell, aggregate
from bat_jax.benchmarks.imaging.stages import STAGES
from launch import evaluate_rounds


def _summary(a: float, b: float):
    """Tracks a and b, every stage and the task at one value each: Overall per track = that value."""
    return aggregate([Cell(t, 0, {s: v for s in STAGES.ids}, v) for t, v in (("a", a), ("b", b))], STAGES)


def test_table_rows_each_step_and_pairs_each_round_with_the_sft_step():
    """Step 0: 0.2 / 0.4 (Overall 30.0); step 2: 0.3 / 0.6 (45.0). Paired differences 0.1 and 0.2: mean 15.0,
    half-width t(0.975, 1) · sd / √2 = 12.706 · 0.0707 / 1.414 = 63.5."""
    text = evaluate_rounds.table({0: _summary(0.2, 0.4), 2: _summary(0.3, 0.6)}, {2: "clean"})
    lines = text.splitlines()
    assert lines[0] == "```" and "step 0 (SFT)" in lines[3] and "30.0" in lines[3]
    assert "step 2 (clean)" in lines[4] and "45.0" in lines[4]
    paired = lines[-1]
    assert paired.startswith("Paired track-level difference step 2 (clean) − step 0 (SFT) (Overall): 15.0 ± 63.5 "
                             "(2 tracks)"), paired
    no_sft = evaluate_rounds.table({3: _summary(0.3, 0.6)}, {})
    assert "step 3 (?)" in no_sft and "Paired" not in no_sft  # nothing to pair without step 0


def test_a_step_the_run_did_not_keep_is_named(tmp_path):
    (tmp_path / "checkpoints").mkdir()

    class Components:
        benchmark = policy = None

    with pytest.raises(FileNotFoundError, match=r"no checkpoint of step\(s\) \[4\] under checkpoints/ \(kept: \[\]\)"):
        evaluate_rounds.measure(tmp_path, Components(), steps=[4])
