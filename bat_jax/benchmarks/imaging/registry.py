"""Track registry: name → Track instance, in the paper's track order."""

from __future__ import annotations

from bat_jax.benchmarks.imaging.base import Track
from bat_jax.benchmarks.imaging.classification import ClassificationTrack
from bat_jax.benchmarks.imaging.detection import DetectionTrack
from bat_jax.benchmarks.imaging.enhancement import EnhancementTrack
from bat_jax.benchmarks.imaging.report_generation import ReportTrack
from bat_jax.benchmarks.imaging.segmentation import SegmentationTrack
from bat_jax.benchmarks.imaging.synthesis import SynthesisTrack
from bat_jax.benchmarks.imaging.vqa import VQATrack

TRACKS: dict[str, Track] = {t.name: t for t in (
    ClassificationTrack(), DetectionTrack(), EnhancementTrack(), ReportTrack(), SegmentationTrack(),
    SynthesisTrack(), VQATrack())}


def get_track(name: str) -> Track:
    """Raises KeyError naming the known tracks."""
    try:
        return TRACKS[name]
    except KeyError:
        raise KeyError(f"unknown track {name!r}; known: {sorted(TRACKS)}") from None
