"""The tabular suite's tables: the cleaning rule, profile, analyses and metrics on hand-built tables with hand-computed
values; generation is deterministic, well posed and its held-out vocabulary is disjoint."""

import pytest

from bat_jax.benchmarks.tabular import tables

HEADER = ["id", "site", "a", "b"]
# r1 twice (an exact copy), r2 first invalid ('NA') then valid again under the same id, r3 without a category,
# r4 with an infinity, r5 valid.
RAW = [["r1", "n", "1.00", "2"], ["r2", "s", "NA", "3"], ["r1", "n", "1.00", "2"], ["r3", "", "4", "5"],
       ["r4", "s", "2.5", "inf"], ["r5", "n", "3", "4"], ["r2", "s", "5", "6"]]


def test_profile_counts_every_raw_record():
    assert tables.profile(HEADER, RAW) == {"rows": 7, "columns": HEADER, "duplicate_ids": 2, "invalid_rows": 3}


def test_cleaning_drops_repeated_ids_first_then_invalid_records():
    kept, log = tables.clean(HEADER, RAW)
    # the second r2 is a repeated id (dropped) even though the first r2 is the invalid one
    assert kept == [["r1", "n", "1.00", "2"], ["r5", "n", "3", "4"]]
    assert log == {"kept": 2, "dropped_duplicates": 2, "dropped_invalid": 3}


@pytest.mark.parametrize("cell, value", [("1.50", 1.5), ("-2", -2.0), ("", None), ("NA", None), ("?", None),
                                         ("nan", None), ("-inf", None), ("1e3", 1000.0)])
def test_number(cell, value):
    assert tables.number(cell) == value


def test_group_mean():
    rows = [["r1", "x", "1", "0"], ["r2", "x", "3", "0"], ["r3", "y", "10", "0"]]
    assert tables.analyse("group_mean", HEADER, rows, {"group": "site", "value": "a"}) == {"x": 2.0, "y": 10.0}


def test_filtered_median_drops_values_beyond_three_mads():
    # median 12, deviations 2, 1, 0, 1, 88 -> MAD 1: 100 is dropped, the median of 10..13 is 11.5
    rows = [[f"r{i}", "x", str(v), "0"] for i, v in enumerate([10, 11, 12, 13, 100])]
    assert tables.analyse("filtered_median", HEADER, rows, {"value": "a", "mad_k": 3.0}) == 11.5
    assert tables.filtered_values([5, 5, 5, 9]) == [5, 5, 5, 9]  # MAD 0 keeps everything


def test_top_corr_orders_by_absolute_r():
    header = ["id", "g", "y", "a", "b", "c", "d"]
    # r(a, y) = 1, r(b, y) = 3/5, r(c, y) = 1/sqrt(10), r(d, y) = -4/5
    cols = {"y": [1, 2, 3, 4], "a": [1, 2, 3, 4], "b": [2, 1, 4, 3], "c": [1, 3, 2, 2], "d": [4, 3, 1, 2]}
    rows = [[f"r{i}", "g"] + [str(cols[n][i]) for n in header[2:]] for i in range(4)]
    r = tables.correlations(header, rows, "y", ["b", "c", "d", "a"])
    assert r == pytest.approx({"a": 1.0, "b": 0.6, "c": 10 ** -0.5, "d": -0.8})
    top = tables.analyse("top_corr", header, rows, {"target": "y", "candidates": ["b", "c", "d", "a"], "k": 2})
    assert list(top) == ["a", "d"] and top == pytest.approx({"a": 1.0, "d": -0.8})


@pytest.mark.parametrize("family, got, want, score", [
    ("group_mean", {"x": 2.005, "y": 10.006, "z": 1}, {"x": 2.0, "y": 10.0}, 1 / 3),  # x within 0.005; y not; z extra
    ("group_mean", {"x": 2.0, "y": 10.0}, {"x": 2.0, "y": 10.0}, 1.0),
    ("group_mean", {"x": True, "y": 10}, {"x": 1.0, "y": 10.0}, 0.5),  # a bool is not a number
    ("group_mean", [2.0, 10.0], {"x": 2.0, "y": 10.0}, 0.0),
    ("filtered_median", 11.505, 11.5, 1.0),  # right to 2 decimals: |0.005| <= 0.005
    ("filtered_median", 11.506, 11.5, 0.0),
    ("filtered_median", 11.5, float("inf"), 0.0),  # no credit against a non-finite host value
    ("filtered_median", "11.5", 11.5, 0.0),
    ("top_corr", {"d": -0.8, "a": 0.99}, {"a": 1.0, "d": -0.8}, 0.5),  # any order; a's r is off
    ("top_corr", {"d": -0.8, "a": 1.0}, {"a": 1.0, "d": -0.8}, 1.0),
    ("top_corr", {"a": 1.0, "d": -0.8, "b": 0.6}, {"a": 1.0, "d": -0.8}, 0.0),  # exactly k columns or nothing
    ("top_corr", {"a": 1.0, "b": 0.6}, {"a": 1.0, "d": -0.8}, 0.5),
    ("top_corr", {"a": 1.0, "d": 0.8}, {"a": 1.0, "d": -0.8}, 0.5),  # the sign is part of r
    ("top_corr", ["a", "d"], {"a": 1.0, "d": -0.8}, 0.0),  # names alone: the round-4 answer
    ("top_corr", {}, {}, 0.0),
])
def test_answer_score(family, got, want, score):
    assert tables.answer_score(family, got, want) == pytest.approx(score)


def test_answer_phrases():
    assert tables.answer_phrases("group_mean", {"x": 2.0, "y": 10.456}) == ["x: 2.00", "y: 10.46"]
    assert tables.answer_phrases("filtered_median", 11.5) == ["11.50"]
    assert tables.answer_phrases("top_corr", {"a": 1.0, "d": -0.8}) == ["a: 1.00", "d: -0.80"]


@pytest.mark.parametrize("family, got, ok", [
    ("filtered_median", 1.5, True), ("filtered_median", True, False), ("filtered_median", [1.5], False),
    ("group_mean", {"x": 1.0}, True), ("group_mean", {}, False), ("group_mean", {"x": "1.0"}, False),
    ("top_corr", {"a": 0.5, "b": -0.1}, True), ("top_corr", {"a": 0.5}, False),
    ("top_corr", {"a": 0.5, "z": 0.1}, False), ("top_corr", ["a", "b"], False)])
def test_is_answer(family, got, ok):
    assert tables.is_answer(family, got, {"candidates": ["a", "b", "c"], "k": 2}) is ok


def test_drawn_from():
    table = tables.Table(("id", "g", "x"), (("r1", "a", "1.50"), ("r2", "b", "NA"), ("r1", "a", "1.50"),
                                             ("r3", "b", "2.00")))
    kept = [["r1", "a", "1.5"], ["r3", "b", "2"]]  # numbers compare as numbers
    assert tables.drawn_from(table, ["id", "g", "x"], kept)
    assert tables.drawn_from(table, ["id", "g", "x"], [["r1", "a", "1.50"]] * 2 + [["r3", "b", "2.00"]])  # raw has 2
    assert tables.drawn_from(table, ["id", "g", "x"], [["r3", "b", "2.00"], ["r1", "a", "1.50"], ["r2", "b", "NA"]])
    assert not tables.drawn_from(table, ["id", "g", "x"], kept * 2)  # r3 thrice: raw has it once
    assert not tables.drawn_from(table, ["id", "g", "x"], kept[:1])  # a record the rule keeps is missing
    assert not tables.drawn_from(table, ["id", "g", "x"], kept + [["r4", "b", "2.00"]])  # not a raw record
    assert not tables.drawn_from(table, ["id", "g", "x"], [["r1", "a", "1.5"], ["r3", "b", "inf"]])
    assert not tables.drawn_from(table, ["id", "x", "g"], kept)


@pytest.mark.parametrize("family", tables.TASK_FAMILIES)
def test_generation_is_deterministic_well_posed_and_has_its_variants_defects(family):
    for variant in tables.VARIANTS:
        table, params = tables.generate(family, 3, variant, tables.TRAIN_VOCAB)
        assert (table, params) == tables.generate(family, 3, variant, tables.TRAIN_VOCAB)
        header, rows = tables.parse_csv(table.csv_bytes().decode())
        assert tuple(header) == table.header and [tuple(r) for r in rows] == list(table.rows)
        prof = tables.profile(header, rows)
        assert (prof["duplicate_ids"] > 0) == (variant in ("duplicates", "mixed"))
        assert (prof["invalid_rows"] > 0) == (variant in ("missing", "mixed"))
        kept, log = tables.clean(header, rows)
        assert log["kept"] == len(kept) == prof["rows"] - prof["duplicate_ids"] - prof["invalid_rows"]
        assert set(header[1:]) <= set(tables.TRAIN_VOCAB.categories + tables.TRAIN_VOCAB.numeric)
        tables.analyse(family, header, kept, params)


def test_the_heldout_vocabulary_shares_no_name_with_training():
    train, held = tables.TRAIN_VOCAB, tables.HELDOUT_VOCAB
    assert not set(train.categories + train.levels + train.numeric) & set(held.categories + held.levels + held.numeric)


def test_unknown_family_or_variant_is_refused():
    with pytest.raises(ValueError, match="unknown variant 'dirty'"):
        tables.generate("group_mean", 0, "dirty", tables.TRAIN_VOCAB)
    with pytest.raises(ValueError, match="unknown task family 'mode'"):
        tables.generate("mode", 0, "clean", tables.TRAIN_VOCAB)
