"""The sweep report: one table over runs, pooled paired differences per group and between groups by seed, each run's
controller path."""

from bat_jax.benchmark.scoring import Cell, aggregate
from bat_jax.report import summary_dict
from bat_jax.sweep_report import sweep_report
from bat_jax.benchmarks.imaging.stages import STAGES


def _summary(values):
    """Tracks t0, t1, ... whose one cell scores `values[i]` on every stage and the task (Overall = the value)."""
    return aggregate([Cell(f"t{i}", 0, {s: v for s in STAGES.ids}, task=v) for i, v in enumerate(values)], STAGES)


def _final():
    return {"untrained": _summary([0.0, 0.0, 0.0]), "SFT": _summary([0.1, 0.2, 0.3]),
            "BiCuRL (retained)": _summary([0.2, 0.2, 0.4])}


def _run(final=None, controller=None):
    out = {"final": {k: summary_dict(v) for k, v in (final or _final()).items()}}
    if controller is not None:
        out["controller"] = controller
    return out


def test_sweep_report_puts_every_run_in_one_table_and_pools_the_paired_difference():
    runs = [(f"seed{i}", _run()) for i in (1, 2)]
    text = sweep_report(runs + [("sft_only", {"final": {"SFT": summary_dict(_final()["SFT"])}})])
    assert "seed1: BiCuRL (retained)" in text and "seed2: untrained" in text and "sft_only: SFT" in text
    assert "seed1: BiCuRL (retained) − SFT = 6.7 ± 14.3 (3 tracks)" in text
    # six (run, track) differences 0.1, 0, 0.1, 0.1, 0, 0.1: mean 6.7, half-width 2.571 * 5.16 / sqrt(6) = 5.4
    assert "trained − SFT: 6.7 ± 5.4 over 6 (run, track) pairs, interval excludes 0" in text


def test_sweep_report_pools_each_group_apart():
    """Two seeds of one method and one ablation: the seeds' six (run, track) pairs pool together, the
    ablation's three alone (same numbers as the ungrouped test: 6.7 ± 5.4 over six; 6.7 ± 14.3 over three)."""
    runs = [(name, _run()) for name in ("seed1", "seed2", "no_s_mix")]
    text = sweep_report(runs, groups={"seed1": "BiCuRL", "seed2": "BiCuRL", "no_s_mix": "no S-mix"})
    assert "BiCuRL − SFT: 6.7 ± 5.4 over 6 (run, track) pairs" in text
    assert "no S-mix − SFT: 6.7 ± 14.3 over 3 (run, track) pairs, interval includes 0" in text
    assert "trained − SFT" not in text


def test_groups_are_paired_by_seed_and_sft_counts_once_per_seed():
    """BiCuRL (trained 20/20/40) against a method that stayed at SFT (10/20/30), seeds 1 and 2, plus a seed 3 that
    only BiCuRL ran (left out of the between-group pairs)."""
    stayed = dict(_final(), **{"GRPO (E2E task reward)": _summary([0.1, 0.2, 0.3])})
    del stayed["BiCuRL (retained)"]
    runs = [("b1", _run()), ("b2", _run()), ("b3", _run()), ("g1", _run(stayed)), ("g2", _run(stayed))]
    groups = {"b1": "BiCuRL", "b2": "BiCuRL", "b3": "BiCuRL", "g1": "GRPO-E2E", "g2": "GRPO-E2E"}
    text = sweep_report(runs, groups=groups, seeds={"b1": 1, "b2": 2, "b3": 3, "g1": 1, "g2": 2})
    # A − B per track 0.1, 0, 0.1 in each of seeds 1, 2: as the six pairs above
    assert "BiCuRL − GRPO-E2E (seeds 1, 2): 6.7 ± 5.4 over 6 (run, track) pairs, interval excludes 0" in text
    assert "GRPO-E2E − SFT: 0.0 ± 0.0 over 6 (run, track) pairs" in text
    # SFT − untrained once per seed (3 seeds x 3 tracks: 0.1, 0.2, 0.3 thrice): mean 20.0, sd 0.0866,
    # half-width 2.306 * 0.0866 / 3 = 6.7, MDE (2.306 + 0.889) * 0.0866 / 3 = 9.2
    assert ("SFT − untrained (one run per seed): 20.0 ± 6.7 over 9 (run, track) pairs, interval excludes 0; "
            "minimum detectable difference 9.2") in text


def test_each_run_prints_its_controller_path():
    path = [{"round": 0, "target": None, "overall": 0.067, "decision": None},
            {"round": 1, "target": "clean", "overall": 0.217, "decision": "accept"}]
    text = sweep_report([("b1", _run(controller=path)), ("b2", _run())])
    assert "  b1: 6.7 → 21.7 (clean, accept)" in text and "  b2:" not in text.split("Controller Overall")[1]
