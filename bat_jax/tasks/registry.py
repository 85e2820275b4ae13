"""Track registry: name → Track instance, in the paper's track order."""

from __future__ import annotations

from bat_jax.tasks.base import Track
from bat_jax.tasks.classification import ClassificationTrack
from bat_jax.tasks.detection import DetectionTrack
from bat_jax.tasks.enhancement import EnhancementTrack
from bat_jax.tasks.report_generation import ReportTrack
from bat_jax.tasks.segmentation import SegmentationTrack
from bat_jax.tasks.synthesis import SynthesisTrack
from bat_jax.tasks.vqa import VQATrack

TRACKS: dict[str, Track] = {t.name: t for t in (
    ClassificationTrack(), DetectionTrack(), EnhancementTrack(), ReportTrack(), SegmentationTrack(),
    SynthesisTrack(), VQATrack())}


def get_track(name: str) -> Track:
    """Raises KeyError naming the known tracks."""
    try:
        return TRACKS[name]
    except KeyError:
        raise KeyError(f"unknown track {name!r}; known: {sorted(TRACKS)}") from None
