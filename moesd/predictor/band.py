"""The predictor's error band: how far published SD speedups have fallen from its predictions.

A prediction is a point; what a deployment will see lies around it. ``records/error_band.csv`` holds, per way of
predicting (:func:`band_variant`: the GPUs' work only, an engine profile, a profile with a measured plain step), the
range of ``published / predicted`` over the validation table of published engine speedups
(``data/engines/published_speedups.csv``), and how often that range held for each source when calibrated on the
others (leave one source out). :func:`moesd.paper.engine_check.error_band` computes it and
:func:`moesd.paper.engine_check.write_error_band` writes the table; this module only reads it, so the predictor
imports nothing of :mod:`moesd.paper`. :func:`moesd.predictor.recommend.recommend` calls SD on only where the band
lies above 1.

Pure Python; no torch.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["BAND_TABLE", "ErrorBand", "load_bands", "BANDS", "band_variant", "error_band_of"]

BAND_TABLE = Path(__file__).resolve().parents[1] / "records" / "error_band.csv"
"""The band's data table, written by :func:`moesd.paper.engine_check.write_error_band`."""


@dataclass(frozen=True)
class ErrorBand:
    """The range of ``published / predicted`` speedups of one way of predicting.

    Attributes
    ----------
    variant : str
        ``"device"``, ``"profile"`` or ``"anchored"`` (:func:`band_variant`).
    low, high : float
        The smallest and largest ``published / predicted`` over the validation table's points.
    points, sources : int
        The points and sources it is calibrated on.
    loso_covered : int
        The points inside the band calibrated on the other sources' points (leave one source out).
    """

    variant: str
    low: float
    high: float
    points: int
    sources: int
    loso_covered: int

    def interval(self, speedup):
        """``(low x speedup, high x speedup)``: the band around predicted speedups (arrays broadcast)."""
        speedup = np.asarray(speedup, dtype=float)
        return self.low * speedup, self.high * speedup


def load_bands(path=None) -> dict:
    """The error bands of a table (default :data:`BAND_TABLE`) by variant."""
    with open(Path(path) if path is not None else BAND_TABLE, newline="") as file:
        return {row["variant"]: ErrorBand(row["variant"], float(row["low"]), float(row["high"]), int(row["points"]),
                                          int(row["sources"]), int(row["loso_covered"])) for row in csv.DictReader(file)}


BANDS = load_bands()
"""The shipped error bands by variant."""


def band_variant(setup) -> str:
    """How ``setup`` (a :class:`~moesd.predictor.setup.Setup`) is predicted: ``"anchored"`` with a measured plain step,
    ``"profile"`` with an engine profile other than ``device``, else ``"device"`` (the GPUs' work, with or without a
    host cost per pass)."""
    if setup.step_seconds is not None:
        return "anchored"
    if setup.engine is not None and setup.engine.name != "device":
        return "profile"
    return "device"


def error_band_of(setup) -> ErrorBand:
    """The :class:`ErrorBand` of ``setup``'s variant."""
    return BANDS[band_variant(setup)]
