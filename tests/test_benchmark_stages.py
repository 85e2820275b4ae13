"""A benchmark's stages as data (bat_jax/benchmark/stages.py): ids, titles and weights in workflow order, parsing by
id or title, score maps, and definitions refused naming the benchmark and the field."""

import pytest

from bat_jax.benchmark.stages import E2E, StageSet

TABLE = StageSet.of([("T1", "Inspect", 0.2), ("T2", "Clean", 0.3), ("T3", "Analyse", 0.3), ("T4", "Report", 0.2)],
                    "tables")


def test_ids_foci_weights_and_labels_in_workflow_order():
    assert TABLE.ids == ("T1", "T2", "T3", "T4") and list(TABLE) == list(TABLE.ids) and len(TABLE) == 4
    assert TABLE.foci == (E2E, "T1", "T2", "T3", "T4")
    assert TABLE.weights == {"T1": 0.2, "T2": 0.3, "T3": 0.3, "T4": 0.2}
    assert "T3" in TABLE and "Analyse" not in TABLE
    assert (TABLE.index("clean"), TABLE.title("T3"), TABLE.label("T4")) == (1, "Analyse", "T4 Report")
    same = StageSet.of([("plan", "plan", 0.5), ("act", "act", 0.5)])
    assert same.label("plan") == "plan"  # id and title the same: the id alone


def test_stages_parse_by_id_or_title_case_insensitively():
    assert [TABLE.parse(v) for v in ("T2", " t2 ", "clean", "REPORT")] == ["T2", "T2", "T2", "T4"]
    assert [TABLE.parse_focus(v) for v in ("e2e", "Inspect")] == ["E2E", "T1"]
    with pytest.raises(ValueError, match=r"unknown stage 'T9' for benchmark 'tables'; expected one of T1/Inspect, "
                                         r"T2/Clean, T3/Analyse, T4/Report"):
        TABLE.parse("T9")


def test_score_maps_are_keyed_by_id_in_order_and_complete():
    scores = TABLE.check_scores({"Report": 0.5, "T1": 1.0, "clean": None, "T3": 0.25}, "round 2 scores")
    assert list(scores.items()) == [("T1", 1.0), ("T2", None), ("T3", 0.25), ("T4", 0.5)]
    with pytest.raises(ValueError, match=r"round 2 scores are missing stages \['T2'\] of benchmark 'tables'"):
        TABLE.check_scores({"T1": 1, "T3": 1, "T4": 1}, "round 2 scores")


@pytest.mark.parametrize("specs, message", [
    ([("A", "a", 1.0)], "a staged benchmark needs at least 2 stages, got 1"),
    ([("A", "a", 0.5), ("A", "b", 0.5)], r"duplicate stage ids \['A'\]"),
    ([("A", "x", 0.5), ("B", "X", 0.5)], r"duplicate stage titles \['x'\]"),
    ([("A", "B", 0.5), ("B", "b2", 0.5)], r"\['B'\] is both a stage id and another stage's title"),
    ([("A", "a", 0.6), ("B", "b", 0.6)], r"weights must sum to 1, got 1.2 \(A=0.6, B=0.6\)"),
    ([("A", "a", -0.5), ("B", "b", 1.5)], r"weight of stage 'A' must be finite and >= 0, got -0.5"),
    ([("e2e", "a", 0.5), ("B", "b", 0.5)], r"stage id 'e2e' is reserved for the end-to-end focus"),
    ([(" A", "a", 0.5), ("B", "b", 0.5)], r"stage id ' A' must be a non-empty string without outer spaces"),
    ([("A", " ", 0.5), ("B", "b", 0.5)], r"stage 'A' needs a non-empty title"),
])
def test_bad_definitions_are_refused_naming_the_benchmark_and_the_field(specs, message):
    with pytest.raises(ValueError, match=r"benchmark 'mine': stages: " + message):
        StageSet.of(specs, "mine")
