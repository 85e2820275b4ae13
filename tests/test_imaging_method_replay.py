"""Host-side replay of a task's provided method (bat_jax/benchmarks/imaging/method_replay.py): information bits of
hand-made values, the files an entry names, and a VQA case's replay against entries equal to it, off by more than
`ATOL`, or short of a key."""

import math

import numpy as np
import pytest

from bat_jax.benchmarks.imaging.method_replay import (ATOL, GUESS_BITS, case_matches, entry_files, guessable,
                                                      information_bits, is_method_output, method_output,
                                                      method_outputs)
from bat_jax.benchmarks.imaging.registry import get_track


def test_information_bits_of_hand_made_values():
    assert information_bits(None) == 1.0 and information_bits(False) == 1.0
    assert information_bits("melanoma") == 4.0
    assert information_bits(6) == 3.0  # log2(2 + 6)
    assert information_bits(-14.0) == 4.0  # an integral float: log2(2 + 14)
    assert information_bits(0.3) == pytest.approx(5.0)  # on the 0.01 grid: log2(2 + 30)
    assert information_bits(0.12345) == pytest.approx(math.log2(5000))  # pinned to ±1e-4: log2(1 / 2e-4)
    assert information_bits(float("nan")) == 0.0
    assert information_bits(np.full((4, 4), 6)) == 3.0  # a constant array: its value's bits
    assert information_bits(np.arange(3)) == math.inf and information_bits(np.zeros(0)) == 0.0
    assert information_bits({"a": 6, "b": [None, "x"]}) == 3.0 + 1.0 + 4.0
    assert information_bits({"answer": "yes", "n": 2}) == 6.0 < GUESS_BITS  # 4 + log2(4): guessable


def test_entry_files_are_the_string_values_with_an_artefact_extension():
    entry = {"mask": "p/a.nii.gz", "label": "x", "scores": "s.npy", "n": 3, "image": "out/b.png", "raw": "c.nii"}
    assert entry_files(entry) == ["p/a.nii.gz", "s.npy", "out/b.png", "c.nii"]
    assert entry_files(["p/a.nii.gz"]) == [] and entry_files({"report": "text.txt"}) == []


def test_a_vqa_case_matches_its_replay_only():
    inst = get_track("vqa").generate(3, "success")
    case = inst.cases[0]
    values, arrays = method_output(inst, case.case_id)
    assert len(method_outputs(inst, case.case_id)) == 1 and arrays == {} and values["answer"] == case.target
    assert case_matches(inst, case.case_id, values, inst.files) is True
    assert is_method_output(inst, case.case_id, dict(values), inst.files)
    first = values["background"][0]
    near = dict(values, background=[first + ATOL / 2] + values["background"][1:])
    far = dict(values, background=[first + 3 * ATOL] + values["background"][1:])
    assert case_matches(inst, case.case_id, near, inst.files) is True
    assert case_matches(inst, case.case_id, far, inst.files) is False
    assert case_matches(inst, case.case_id, {"answer": case.target}, inst.files) is False  # the keys differ
    assert case_matches(inst, case.case_id, "not a dict", inst.files) is False
    assert case_matches(inst, "no-such-case", values, inst.files) is None  # no replay
    assert not is_method_output(inst, "no-such-case", values, inst.files)
    assert not guessable(inst, case.case_id) and guessable(inst, "no-such-case")
