"""The scorecard: every claim of :mod:`moesd.paper.verdicts` judged on one device folder of
``data/measurements/``, and the folders there.
"""

from __future__ import annotations

import pandas as pd

from moesd.paper.criteria import UNMEASURABLE
from moesd.narration import verdict
from moesd.paper.verdicts import (CLAIMS, efficiency_moe_rises_dense_falls, moe_above_dense, poor_coverage_worst_fits,
                                  shape_holds_across_settings, sparser_peaks_later_and_wider,
                                  speedup_rises_then_falls)


STUDIES = ("e2e", "forward", "dense", "dense_forward", "sparsity", "settings")
"""The result files the claims read from a device folder."""


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
    from moesd.model.diagnostics import robustness_study
    from moesd.model.measurements import from_sweep
    from moesd.measure.analysis import ridge_tokens_for
    from moesd.zoo import get_model

    target = sidecar.get("settings", {}).get("target")
    try:
        num_experts = get_model(str(target)).num_experts
    except KeyError as error:
        raise ValueError(f"the sidecar's target {target!r} is not a known model") from error
    if not num_experts:
        raise ValueError(f"the sidecar's target {target!r} is not an MoE")
    from moesd.model.algorithm1 import PARAMETERS
    from moesd.model.measurements import mean_over_repeats

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


def verdicts(frames: dict, robustness: pd.DataFrame | None = None, robustness_note: str | None = None) -> list:
    """Every claim's :class:`Verdict` from a dict of study frames (keys of :data:`STUDIES`; any may be missing).

    ``robustness`` is the Table 3 input (:func:`moesd.model.diagnostics.robustness_study`); without it, Table 3 is
    not measurable, for the reason ``robustness_note`` (default: no robustness study).
    """
    table3 = poor_coverage_worst_fits(robustness)
    if robustness is None and robustness_note:
        table3 = verdict("Table 3", CLAIMS["Table 3"], UNMEASURABLE, [], robustness_note)
    return [speedup_rises_then_falls(frames.get("e2e")),
            efficiency_moe_rises_dense_falls(frames.get("forward"), frames.get("dense_forward")),
            sparser_peaks_later_and_wider(frames.get("sparsity")),
            shape_holds_across_settings(frames.get("settings")),
            moe_above_dense(frames.get("e2e"), frames.get("dense")),
            table3]


def scorecard(device: str, robustness: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per claim for a device folder of ``data/measurements/``: claim, status, summary, sentence, measured_with.

    Missing result files make their claims "not measurable here". Table 3 uses ``robustness`` when
    given (an empty frame skips it), else fits the device's sparsity study (:func:`robustness_for`,
    21 fits, seconds); a sidecar without a measured roofline makes it not measurable, and says so.
    """
    frames, sidecars = load_studies(device)
    note = None if "sparsity" in frames else "no complete sparsity study on this device"
    if robustness is None and "sparsity" in frames:
        try:
            robustness = robustness_for(frames["sparsity"], sidecars["sparsity"])
        except ValueError as error:
            note = f"the robustness study cannot be fitted: {error}"
    basis = measured_with(sidecars)
    rows = [{"device": device, "claim": v.claim, "status": v.status, "summary": v.summary, "sentence": v.sentence,
             "measured_with": basis}
            for v in verdicts(frames, robustness, note)]
    return pd.DataFrame(rows)


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
