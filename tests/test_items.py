"""Rubric item pass rates (benchmark/items.py) through cells, summaries, the ledger, report.md, items.png and
TensorBoard; the minimum detectable difference of paired comparisons (benchmark/scoring.py); the held-out firewall
over all of these outputs."""

import dataclasses
import json
import math

import pytest

from bat_jax import report
from bat_jax.benchmark.items import ItemRates, changes, failing_items_table, heat_map
from bat_jax.benchmark.scoring import Cell, aggregate, half_width, min_detectable_difference, paired_comparison
from bat_jax.benchmark.stages import StageSet
from bat_jax.ledger import GRPOStats, Ledger, LedgerError, RoundRecord
from bat_jax.verify.rubric import EpisodeScore, StageVerdict

TOY = StageSet.of([("P", "Plan", 0.5), ("Q", "Quality", 0.5)], "toy")


def _rates(**counts):
    """ItemRates from 'stage__item' = {track: (passed, decided)}."""
    out = {}
    for key, tracks in counts.items():
        stage, item = key.split("__")
        out.setdefault(stage, {})[item] = tracks
    return ItemRates(out)


def test_tally_counts_decisions_per_stage_item_and_track():
    rates = ItemRates.tally([
        ("a", {"P": {"p1": True, "p2": False}, "Q": {"q1": True}}),
        ("a", {"P": {"p1": False, "p2": False}, "Q": None}),  # Q not verified: no decision counted
        ("b", {"P": {"p1": True}}),  # p2 absent from this task's rubric
        ("b", None),  # nothing recorded
    ])
    assert rates.to_dict() == {"P": {"p1": {"a": [1, 2], "b": [1, 1]}, "p2": {"a": [0, 2]}},
                               "Q": {"q1": {"a": [1, 1]}}}
    assert rates.count("P", "p1") == (2, 3) and rates.rate("P", "p1") == pytest.approx(2 / 3)
    assert rates.rate("P", "p1", "a") == 0.5 and rates.rate("P", "p2") == 0.0
    assert rates.rate("Q", "q1", "b") is None and rates.rate("Q", "nope") is None
    assert rates.keys(TOY) == [("P", "p1"), ("P", "p2"), ("Q", "q1")]
    assert rates.tracks() == ["a", "b"]
    assert rates.scalars() == pytest.approx({"P/p1": 200 / 3, "P/p2": 0.0, "Q/q1": 100.0})
    assert ItemRates.from_dict(json.loads(json.dumps(rates.to_dict()))) == rates
    assert not ItemRates.tally([]) and not ItemRates.from_dict(None)


@pytest.mark.parametrize("bad, match", [
    ({"P": {"p1": {"a": [3, 2]}}}, "passed <= decided"),
    ({"P": {"p1": {"a": [0, 0]}}}, "decided >= 1"),
    ({"P": {"p1": {"a": [1]}}}, r"expected \[passed, decided\]"),
    ({"P": {"p1": {"a": [True, 1]}}}, "ints"),
    ({"P": ["p1"]}, "expected"),
])
def test_malformed_item_counts_are_named(bad, match):
    with pytest.raises(ValueError, match=match) as e:
        ItemRates.from_dict(bad, "ledger line 3")
    assert "ledger line 3" in str(e.value)


def test_aggregate_counts_items_over_scored_cells_only():
    cells = [
        Cell("t1", 0, {"P": 1.0, "Q": 0.5}, 0.0, items={"P": {"p1": True}, "Q": {"q1": True, "q2": False}}),
        Cell("t1", 1, {"P": 0.0, "Q": 0.5}, None, items={"P": {"p1": False}}),  # unscored: left out
        Cell("t2", 0, {"P": 0.0, "Q": 0.0}, 0.0, items={"P": {"p1": False}, "Q": {"q1": False, "q2": False}}),
        Cell("t2", 1, {"P": 0.0, "Q": 0.0}, 0.0),  # items not recorded (an external evaluator's cell)
    ]
    summary = aggregate(cells, TOY)
    assert summary.n_unscored == 1
    assert summary.items.to_dict() == {"P": {"p1": {"t1": [1, 1], "t2": [0, 1]}},
                                       "Q": {"q1": {"t1": [1, 1], "t2": [0, 1]}, "q2": {"t1": [0, 1], "t2": [0, 1]}}}
    assert summary.items.rate("P", "p1") == 0.5
    # summary.json keeps them; an older summary.json without them reads as empty
    assert report.summary_from_dict(report.summary_dict(summary)).items == summary.items
    old = report.summary_dict(summary)
    del old["items"]
    assert not report.summary_from_dict(old).items


def test_episode_score_cells_carry_the_decisions_of_verified_stages():
    score = EpisodeScore({"P": StageVerdict("P", {"p1": True, "p2": False}, {}, 1.0, 0.5), "Q": None}, 0.0, None)
    cell = score.to_cell("t1", 0, TOY)
    assert cell.items == {"P": {"p1": True, "p2": False}}
    assert cell.stage_scores == {"P": 0.5, "Q": None}


def test_changes_name_the_rounds_an_item_moved_in():
    series = [_rates(P__p1={"a": (0, 2)}), None, _rates(P__p1={"a": (1, 2)}), _rates(P__p1={"a": (1, 2)}),
              _rates(P__p1={"a": (2, 2)})]
    # round 1 recorded nothing: round 2 is compared with round 0
    assert changes(series, "P", "p1") == [(2, 0.0, 0.5), (4, 0.5, 1.0)]
    assert changes(series, "Q", "q1") == []


def test_failing_items_table_ranks_by_the_last_system_and_shows_rounds():
    controller = [_rates(P__p1={"a": (0, 2)}, P__p2={"a": (2, 2)}, P__p3={"a": (1, 2)}, Q__q1={"a": (1, 2)}),
                  _rates(P__p1={"a": (1, 2)}, P__p2={"a": (2, 2)}, P__p3={"a": (1, 2)}, Q__q1={"a": (1, 2)})]
    final = {"SFT": _rates(P__p1={"a": (0, 4)}, P__p2={"a": (4, 4)}, P__p3={"a": (1, 4)}, Q__q1={"a": (2, 4)}),
             "BiCuRL": _rates(P__p1={"a": (3, 4)}, P__p2={"a": (4, 4)}, P__p3={"a": (1, 4)}, Q__q1={"a": (0, 4)})}
    rollouts = [_rates(P__p1={"a": (1, 8)})]
    table = failing_items_table(TOY, final, controller, rollouts, per_stage=2)
    # ranked by BiCuRL's final rates: P p3 25, p1 75 (p2 100 left out); rollouts 1/8 = 12.5 prints 12
    assert table.splitlines() == [
        "stage      item  final SFT  final BiCuRL  controller r0→r1  changed in     GRPO rollouts r1→r1",
        "-" * 94,
        "P Plan     p3    25         25            50 → 50           never          —",
        "P Plan     p1    0          75            0 → 50            round 1 (+50)  12",
        "Q Quality  q1    50         0             50 → 50           never          —",
    ]
    assert failing_items_table(TOY, {}, [None], []) == ""


def test_heat_map_writes_a_png(tmp_path):
    path = heat_map(TOY, [("round 0", _rates(P__p1={"a": (0, 2)})), ("round 1", None),
                          ("final", _rates(P__p1={"a": (2, 2)}, Q__q1={"a": (1, 2)}))], tmp_path / "items.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="no rubric item"):
        heat_map(TOY, [("round 0", None)], tmp_path / "none.png")


def test_min_detectable_difference_by_hand():
    # n = 7, differences -3..3 points: sd = sqrt(28 / 6) = 2.160247, SE = sd / sqrt(7) = 0.816497;
    # t_{0.975, 6} = 2.446912 and t_{0.80, 6} = 0.905703 (Student-t table): MDE = 3.352615 * 0.816497 = 2.737401
    diffs = [d / 100 for d in (-3, -2, -1, 0, 1, 2, 3)]
    assert min_detectable_difference(diffs) == pytest.approx(0.02737401, rel=1e-6)
    assert half_width(diffs) == pytest.approx(0.02446912 * 0.816497, rel=1e-5)
    # n = 2: sd = 0.141421, SE = 0.1; t_{0.975, 1} = 12.706205, t_{0.80, 1} = 1.376382
    assert min_detectable_difference([0.1, 0.3]) == pytest.approx(1.4082587, rel=1e-6)
    # power 0.5: t_{0.5} = 0, the MDE is the half-width (the smallest significant difference)
    assert min_detectable_difference(diffs, power=0.5) == pytest.approx(half_width(diffs))
    # four times the cells per track halve sd of the track means when the cells' noise dominates: MDE halves
    assert min_detectable_difference([d / 2 for d in diffs]) == pytest.approx(0.02737401 / 2, rel=1e-6)
    assert min_detectable_difference([0.2]) is None
    with pytest.raises(ValueError, match="power"):
        min_detectable_difference(diffs, power=1.0)


def _summary_with_tracks(values):
    cells = [Cell(t, 0, {"P": v, "Q": v}, v) for t, v in values.items()]
    return aggregate(cells, TOY)


def test_paired_lines_say_when_a_difference_is_inside_the_mde():
    base = _summary_with_tracks({f"t{i}": 0.5 for i in range(7)})
    noisy = _summary_with_tracks({f"t{i}": 0.5 + d / 100 for i, d in enumerate((-3, -2, -1, 0, 1, 2, 4))})
    cmp = paired_comparison(noisy, base)
    assert cmp.mean_diff == pytest.approx(1 / 700) and cmp.detectable is False
    # differences -3, -2, -1, 0, 1, 2, 4 points: mean 1/7, sd = sqrt((35 - 7 / 49) / 6) = 2.410295, SE = 0.911006:
    # half-width 2.446912 * SE = 2.229, MDE 3.352615 * SE = 3.054
    sd = math.sqrt((35 - 7 / 49) / 6)
    assert sd == pytest.approx(2.410295, rel=1e-6)
    assert cmp.mde == pytest.approx(3.352615 * 0.911006 / 100, rel=1e-5)
    line = report.paired_line("B", noisy, "A", base)
    assert line == ("Paired track-level difference B − A (Overall): 0.1 ± 2.2 (7 tracks); minimum detectable "
                    "difference 3.1 (95 % level, 80 % power): the difference is inside it: these cells cannot tell "
                    "the two systems apart")
    shifted = _summary_with_tracks({f"t{i}": 0.6 + d / 100 for i, d in enumerate((-3, -2, -1, 0, 1, 2, 4))})
    assert paired_comparison(shifted, base).detectable is True
    assert report.paired_line("B", shifted, "A", base).endswith("the difference is larger than it")
    one = _summary_with_tracks({"t0": 0.5})
    assert report.paired_line("B", one, "A", one).endswith("minimum detectable difference: — (fewer than 2 tracks)")
    same = _summary_with_tracks({f"t{i}": 0.1 * i for i in range(3)})
    assert report.paired_line("B", same, "A", same) == (
        "Paired track-level difference B − A (Overall): 0.0 ± 0.0 (3 tracks); every track scored the same in both "
        "systems (for example the same checkpoint retained): no difference to detect")


def _record(round_index, **kw):
    return RoundRecord(round=round_index, selected_stage="P", routing_report={}, pool_counts={"target": 1},
                       bank_version=1, state_ids=["s"], reward_version="v", controller_scores={"overall": 0.1,
                       "stage_scores": {"P": 0.1, "Q": 0.0}}, kl=0.0, decision="accept", retained_checkpoint="c",
                       **kw)


def test_ledger_keeps_item_counts_and_reads_older_lines(tmp_path):
    ledger = Ledger(tmp_path / "ledger.jsonl")
    items = {"P": {"p1": {"a": [1, 2]}}}
    ledger.append(_record(1, eval_items=items, grpo=GRPOStats(rollouts=2, items=items)))
    old = _record(2).to_dict()  # a line written before the item counts existed
    del old["eval_items"], old["grpo"]["items"]
    (tmp_path / "ledger.jsonl").write_text((tmp_path / "ledger.jsonl").read_text() + json.dumps(old) + "\n")
    first, second = ledger.read()
    assert first.eval_item_rates().rate("P", "p1") == 0.5 and first.grpo.item_rates().count("P", "p1") == (1, 2)
    assert second.eval_items is None and not second.eval_item_rates() and not second.grpo.item_rates()
    bad = _record(3).to_dict() | {"eval_items": {"P": {"p1": {"a": [3, 2]}}}}
    (tmp_path / "ledger.jsonl").write_text((tmp_path / "ledger.jsonl").read_text() + json.dumps(bad) + "\n")
    with pytest.raises(LedgerError, match="line 3.*passed <= decided"):
        ledger.read()



@pytest.mark.slow
def test_item_outputs_hold_the_heldout_firewall(tmp_path):
    """Real held-out cells (the scripted expert and the do-nothing baseline on two tracks, controller and final
    runs) through the ledger, report.md, items.png, summary.json and TensorBoard: none of the leakage preflight's
    markers (task ids, case ids, paths, texts of the held-out manifest) appears in any of them."""
    from bat_jax.bicurl import evaluation as ev
    from bat_jax.curriculum.controller import Evaluation
    from bat_jax.sandbox.backends import local_sandbox
    from bat_jax.stage_bank.leakage import HeldOutManifest, preflight
    from bat_jax.benchmarks.imaging.benchmark import ImagingBenchmark
    from bat_jax.benchmarks.imaging.teacher import DoNothingPolicy, ScriptedExpert

    imaging = ImagingBenchmark()
    config = ev.EvalConfig(repeats=1, final_repeats=2, tracks=("vqa", "classification"), max_workers=2)

    def run(policy, purpose):
        cells = ev.PolicyCells(imaging, lambda seed: policy(), local_sandbox, progress=False)
        return ev.evaluate(cells, dataclasses.replace(config, purpose=purpose), imaging)

    controller = run(ScriptedExpert, "controller")
    final = {"untrained": run(DoNothingPolicy, "final"), "SFT": run(ScriptedExpert, "final")}
    assert final["SFT"].n_cells == 4 and controller.n_cells == 2  # final_repeats = 2, repeats = 1
    assert final["SFT"].items.rate("S1", "plan.read_brief") == 1.0
    assert final["untrained"].items.rate("S1", "plan.read_brief") == 0.0
    assert final["SFT"].items.count("S1", "plan.read_brief", "vqa") == (2, 2)  # both final vqa cells
    record = _record(1, eval_items=controller.items.to_dict(),
                     grpo=GRPOStats(rollouts=2, items=final["SFT"].items.to_dict()))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    Ledger(run_dir / "ledger.jsonl").append(record)
    writer = report.ScalarWriter(run_dir / "tensorboard", imaging.stages)
    writer.summary("controller_eval", controller, 1)
    for key, value in record.grpo.scalars().items():
        writer.scalar(f"grpo/{key}", value, 1)
    report.write_run_report(run_dir, final, [record], Evaluation.from_summary(controller), imaging.stages, writer,
                            round0_items=controller.items.to_dict())
    text = (run_dir / "report.md").read_text()
    assert "Rubric items that fail most" in text and "plan.read_brief" in text and (run_dir / "items.png").is_file()
    events = b"".join(p.read_bytes() for p in (run_dir / "tensorboard").iterdir())
    assert b"controller_eval/items/S1/plan.read_brief" in events and b"final/SFT/items/S1/plan.read_brief" in events

    raw = ev.heldout_manifest(config, imaging)
    manifest = HeldOutManifest.from_task_manifest(raw)
    assert len(manifest.task_ids) == 2 * (1 + 2 + 2)  # per track: the controller's task, two per final suite
    scan = preflight(manifest, files=[run_dir])
    assert scan.files_scanned >= 6 and scan.clean, [str(h) for h in scan.hits]
    blob = b"".join(p.read_bytes() for p in run_dir.rglob("*") if p.is_file())
    for marker in manifest.task_ids + manifest.case_ids:
        assert marker.encode() not in blob, marker
    # the same scan finds a marker planted beside the outputs: the check can fail
    (run_dir / "planted.md").write_text(f"see {manifest.task_ids[0]}\n")
    assert not preflight(manifest, files=[run_dir]).clean
