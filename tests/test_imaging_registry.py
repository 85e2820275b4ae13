"""The imaging suite's track registry (bat_jax/benchmarks/imaging/registry.py): the seven tracks in the paper's
order."""

import pytest

from bat_jax.benchmarks.imaging.registry import TRACKS, get_track
from bat_jax.benchmarks.imaging.report_generation import ReportTrack


def test_seven_tracks_in_the_papers_order():
    assert list(TRACKS) == ["classification", "detection", "enhancement", "report", "segmentation", "synthesis",
                            "vqa"]
    assert all(TRACKS[name].name == name for name in TRACKS)
    assert isinstance(get_track("report"), ReportTrack) and get_track("vqa") is TRACKS["vqa"]


def test_an_unknown_track_is_refused_naming_the_known_ones():
    with pytest.raises(KeyError, match=r"unknown track 'xray'; known: \['classification', 'detection', "
                                       r"'enhancement', 'report', 'segmentation', 'synthesis', 'vqa'\]"):
        get_track("xray")
