"""The scorecard: every claim of :mod:`moesd.paper.verdicts` and :mod:`moesd.paper.sparsity_verdicts` judged on one
device folder of ``data/measurements/``, whether each claim's studies are in the paper's regime, and the folders.
"""

from __future__ import annotations

import json

import pandas as pd

from moesd.paper.criteria import NO_STUDY, NOT_FITTED, UNTESTABLE, Verdict
from moesd.paper.sparsity_verdicts import poor_coverage_worst_fits, sparser_peaks_later_and_wider
from moesd.paper.verdicts import (efficiency_moe_rises_dense_falls, moe_above_dense, shape_holds_across_settings,
                                  speedup_rises_then_falls, untestable)

STUDIES = ("e2e", "forward", "dense", "dense_forward", "sparsity", "settings")
"""The result files the claims read from a device folder."""

CLAIM_STUDIES = {"Fig. 2": ("e2e",), "Fig. 3": ("forward", "dense_forward"), "Fig. 4": ("sparsity",),
                 "Fig. 5": ("settings",), "Fig. 6": ("e2e", "dense"), "Table 3": ("sparsity",)}
"""The studies each claim is judged on."""


def robustness_for(sparsity: pd.DataFrame, sidecar: dict, **fit_options) -> pd.DataFrame:
    """Appendix C.3's robustness study of a device's sparsity study, with that device's ridge point.

    E comes from the target named in the sidecar (:func:`moesd.zoo.get_model`), the ridge point from
    the sidecar's measured roofline, in tokens (:func:`moesd.measure.analysis.ridge_tokens_for`). A point
    measured in several repeats is first averaged over them (:func:`moesd.model.measurements.mean_over_repeats`; the
    paper's points are means over runs too). Unless ``fit_options`` name the samples, a study of the
    paper's 228 points takes its strides (:data:`moesd.model.samples.PAPER_STRIDES`) and any other design a
    spread sample of every size from the model's 10 parameters to all points (``sizes``), as the
    Fitting robustness chapter does.

    Raises
    ------
    ValueError
        If the sidecar holds no measured roofline or names no known MoE target, or the study has
        too few rows for a fit.
    """
    from moesd.measure.analysis import ridge_tokens_for
    from moesd.model.algorithm1 import PARAMETERS
    from moesd.model.diagnostics import robustness_study
    from moesd.model.measurements import from_sweep, mean_over_repeats
    from moesd.zoo import get_model

    target = sidecar.get("settings", {}).get("target")
    try:
        num_experts = get_model(str(target)).num_experts
    except KeyError as error:
        raise ValueError(f"the sidecar's target {target!r} is not a known model") from error
    if not num_experts:
        raise ValueError(f"the sidecar's target {target!r} is not an MoE")
    if "run" in sparsity and sparsity["run"].nunique() > 1:
        sparsity = mean_over_repeats(sparsity)
    frame = from_sweep(sparsity, num_experts)
    if "strides" not in fit_options and "sizes" not in fit_options and len(frame) != 228:
        fit_options["sizes"] = range(len(PARAMETERS), len(frame) + 1)
    return robustness_study(frame, ridge_tokens_for(sidecar), **fit_options)


def load_studies(device: str) -> tuple[dict, dict]:
    """The claims' complete result files on one device: (study -> frame, study -> sidecar).

    Missing files and files whose sidecar says the sweep did not finish (``complete: false``) are left
    out: a study stopped part-way has fewer points than its design, and the claims judge designs.
    """
    from moesd.measure.studies import load

    frames, sidecars = {}, {}
    for study in STUDIES:
        try:
            frame, sidecar = load(study, device)
        except FileNotFoundError:
            continue
        if sidecar.get("complete"):
            frames[study], sidecars[study] = frame, sidecar
    return frames, sidecars


def verdicts(frames: dict, robustness: pd.DataFrame | None = None, sidecars: dict | None = None,
             table3: Verdict | None = None) -> list:
    """Every claim's :class:`~moesd.paper.criteria.Verdict` from a dict of study frames (keys of :data:`STUDIES`).

    ``robustness`` is the Table 3 input (:func:`moesd.model.diagnostics.robustness_study`); without it, Table 3 is
    not testable (no robustness study), unless ``table3`` gives its verdict already (e.g. not testable, for the
    reason the caller found). ``sidecars`` (study -> sidecar) give Fig. 3 Eq. 8's memory-bound efficiency and
    Fig. 4 the model and context its K = 1, 2 part needs.
    """
    sidecars = sidecars or {}
    if table3 is None:
        table3 = poor_coverage_worst_fits(robustness)
    return [speedup_rises_then_falls(frames.get("e2e")),
            efficiency_moe_rises_dense_falls(frames.get("forward"), frames.get("dense_forward"),
                                             sidecar=sidecars.get("forward")),
            sparser_peaks_later_and_wider(frames.get("sparsity"), sidecar=sidecars.get("sparsity")),
            shape_holds_across_settings(frames.get("settings")),
            moe_above_dense(frames.get("e2e"), frames.get("dense")),
            table3]


def regimes(device: str, frames: dict, sidecars: dict) -> pd.DataFrame:
    """Per study of a device folder: its :class:`~moesd.measure.regime.StudyRegime` fields, indexed by study."""
    from moesd.measure.regime import RegimeCheck, study_regime
    from moesd.measure.studies import measurements_dir

    path = measurements_dir() / device / "regime.json"
    check = RegimeCheck.from_dict(json.loads(path.read_text())) if path.is_file() else None
    rows = {study: vars(study_regime(frames[study], sidecars[study], check)) for study in frames}
    return pd.DataFrame.from_dict(rows, orient="index",
                                  columns=["streaming_share", "products_share", "weight_share", "in_regime"])


def scorecard(device: str, robustness: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per claim for a device folder of ``data/measurements/``.

    Columns: ``device``, ``claim``, ``status`` (the material reading), ``strict_status``, ``measured_with``,
    ``in_regime`` (every study the claim reads is in the paper's regime, :func:`moesd.measure.regime.study_regime`;
    False for a claim with no study), ``weight_share`` (the smallest of its studies') and ``verdict`` (the
    :class:`~moesd.paper.criteria.Verdict`; ``moesd.narration.worded`` adds its sentences as columns). Missing
    result files make their claims "not testable here". Table 3 uses ``robustness`` when given (an empty frame
    skips it), else fits the device's sparsity study (:func:`robustness_for`, seconds); a sidecar without a
    measured roofline makes it not testable, with the reason code ``NOT_FITTED`` and the fit's error in its
    verdict's options.
    """
    frames, sidecars = load_studies(device)
    table3 = None
    if robustness is None and "sparsity" not in frames:
        table3 = untestable("Table 3", NO_STUDY, studies=("sparsity",))
    elif robustness is None:
        try:
            robustness = robustness_for(frames["sparsity"], sidecars["sparsity"])
        except ValueError as error:
            table3 = untestable("Table 3", NOT_FITTED, error=str(error))
    regime = regimes(device, frames, sidecars)
    basis = measured_with(sidecars)
    rows = []
    for v in verdicts(frames, robustness, sidecars, table3):
        studies = [s for s in CLAIM_STUDIES[v.claim] if s in regime.index]
        judged = len(studies) == len(CLAIM_STUDIES[v.claim])
        rows.append({"device": device, "claim": v.claim, "status": v.status, "strict_status": v.strict.status,
                     "measured_with": basis, "in_regime": bool(judged and regime.loc[studies, "in_regime"].all()),
                     "weight_share": float(regime.loc[studies, "weight_share"].min()) if studies else float("nan"),
                     "verdict": v})
    return pd.DataFrame(rows)


def first_page(cards: pd.DataFrame) -> pd.DataFrame:
    """The rows of scorecards (:func:`scorecard`, concatenated) a reader sees first: claims whose studies are in the
    paper's regime and that some reading could test; the others belong beside the contrast that explains them."""
    keep = cards["in_regime"] & ~((cards["status"] == UNTESTABLE) & (cards["strict_status"] == UNTESTABLE))
    return cards[keep].reset_index(drop=True)


def measured_with(sidecars: dict) -> str:
    """What a device folder's studies ran on, from their sidecars: e.g. ``"random weights, synthetic acceptance"``.

    One entry per distinct combination of weights and acceptance (forward studies have none), joined by
    ``"; "``; a sidecar without the weights says ``"weights not recorded"``.
    """
    kinds = set()
    for sidecar in sidecars.values():
        kind = f"{sidecar['weights']} weights" if sidecar.get("weights") else "weights not recorded"
        mode = (sidecar.get("acceptance") or {}).get("mode", "none")
        kinds.add(kind if mode == "none" else f"{kind}, {mode} acceptance")
    return "; ".join(sorted(kinds)) or "no study"


def devices() -> list[str]:
    """Device folders of ``data/measurements/`` (each gets a scorecard)."""
    from moesd.measure.studies import measurements_dir

    return sorted(path.name for path in measurements_dir().iterdir() if path.is_dir())

