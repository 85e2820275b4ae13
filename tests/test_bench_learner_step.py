"""launch/bench/bench_learner_step.py runs end to end at a small size, and its three settings agree in value."""

import re

import pytest

from launch.bench import bench_learner_step


@pytest.mark.slow
def test_bench_prints_every_setting_and_the_same_logprobs(capsys):
    assert bench_learner_step.main(["--rows", "2", "--seq", "320", "--micro", "2", "--steps", "1"]) == 0
    out = capsys.readouterr().out
    for name, _, _ in bench_learner_step.settings():
        assert re.search(rf"^  {re.escape(name)}\s+first step\s+[\d.]+ s\s+warm step", out, re.M), out
    diffs = [float(d) for d in re.findall(r"max \|logprob difference\| ([\d.e+-]+)\)", out)]
    assert len(diffs) == 2 and max(diffs) < 1e-4, out
