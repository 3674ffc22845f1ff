"""The predictor (:mod:`moesd.predictor.predict`) beside the paper's Tables 1-2: peaks, orderings and what closes the gap.

* :func:`paper_comparison`: every Qwen2-57B-A14B + Qwen2-0.5B row of Tables 1-2 beside the predicted peak of
  the same setup (nothing fitted to the tables);
* :func:`paper_orderings`: the orderings the paper reports (faster GPU, fewer GPUs, PCIe), printed and predicted,
  with sign and signed-rank tests of the print's own support for each;
* :func:`ordering_scan`: those orderings, the peak batch sizes and the level gap under several efficiencies
  (a lower achieved FLOP/s, a host cost per forward pass);
* :func:`model_stages`: the predicted peak as the model's pieces are added one by one;
* :func:`efficiency_to_match`: what one overhead or efficiency would have to be for the predicted peak to
  equal a measured speedup.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from moesd._checks import UsageError, as_array
from moesd.predictor.engine import HOST_SECONDS_VLLM_V0
from moesd.predictor.kernels import Efficiency
from moesd.predictor.predict import PAPER_BATCH_SIZES, predict_sd
from moesd.predictor.setup import Setup
from moesd.theory.roofline import hardware_record

__all__ = ["HOST_SECONDS_VLLM_V0", "PAPER_ORDERINGS", "efficiency_to_match", "paper_comparison", "paper_orderings",
           "ordering_scan", "model_stages"]


def efficiency_to_match(speedup, setup: Setup, batch_size, gamma, sigma, field="step_seconds", bounds=(0.0, 0.1),
                        efficiency: Efficiency | None = None, apply_to="both") -> float:
    """The value of one :class:`Efficiency` field at which the predicted peak speedup equals ``speedup``.

    The peak is the maximum over ``batch_size`` of :func:`predict_sd` of ``setup`` at one ``gamma`` and ``sigma``;
    the field (e.g. ``"step_seconds"``, a fixed cost per forward pass) is set for the target, the draft
    or both (``apply_to``) and found by bisection within ``bounds``. It answers "what would this
    overhead have to be to explain a measured speedup", not what it is.

    Raises
    ------
    ValueError
        If the speedup is not reached within ``bounds`` (the message gives the peaks at both ends).
    """
    from scipy.optimize import brentq

    if field not in ("bandwidth_fraction", "flops_fraction", "kernel_seconds", "launch_seconds", "step_seconds",
                     "expert_seconds"):
        raise UsageError(f"field must be a field of Efficiency, got {field!r}", "field")
    if apply_to not in ("both", "target", "draft"):
        raise UsageError(f"apply_to must be 'both', 'target' or 'draft', got {apply_to!r}", "apply_to")
    speedup = float(as_array("speedup", speedup, low=0, low_open=True))
    efficiency = efficiency or Efficiency()

    def gap(value):
        changed = dataclasses.replace(efficiency, **{field: value})
        frame = predict_sd(setup, batch_size, gamma, sigma, efficiency=efficiency if apply_to == "draft" else changed,
                           draft_efficiency=efficiency if apply_to == "target" else changed)
        return frame["speedup"].max() - speedup

    low, high = gap(bounds[0]), gap(bounds[1])
    if low * high > 0:
        raise UsageError(f"speedup {speedup:g} is not reached for {field} in {bounds}: peaks "
                         f"{low + speedup:.3g} and {high + speedup:.3g}", "speedup")
    return float(brentq(gap, *bounds, xtol=1e-9 * max(1.0, abs(bounds[1])), rtol=1e-6))


def _paper_device(device: str) -> tuple[str, int]:
    """``"2xH800"`` as ``("H800", 2)``."""
    count, _, name = device.partition("x")
    return name, int(count)


def paper_comparison(context=256, efficiency: Efficiency | None = None, batch_sizes=PAPER_BATCH_SIZES,
                     match=True, where: dict | None = None) -> pd.DataFrame:
    """Tables 1-2's Qwen2-57B-A14B + Qwen2-0.5B rows beside this model's prediction of the same setup.

    For every printed row (device, dataset, temperature, gamma, sigma, peak speedup ``x``) the peak of
    :func:`predict_sd` over the paper's batch sizes at that row's gamma and sigma, on the row's GPUs
    (target on all of them, draft on one), in bf16. Nothing here is fitted to the tables.

    Parameters
    ----------
    context : int, default 256
        Tokens in each KV cache (the paper does not state it; its prompts are 5-391 tokens long).
    efficiency : Efficiency, optional
        The model's efficiency and overheads (default :class:`Efficiency`: data-sheet peaks at
        microbenchmarks' achieved fractions, no engine overhead).
    batch_sizes : sequence of int
        Where the peak is searched (default the paper's grid).
    match : bool, default True
        Also find the fixed cost per forward pass (``step_seconds``, target and draft alike) and per
        draft step alone that would bring the predicted peak down to the printed ``x``.
    where : dict, optional
        Keep only printed rows with these column values, e.g. ``{"dataset": "humaneval", "gamma": 4}``.

    Returns
    -------
    pandas.DataFrame
        The printed columns (``device``, ``dataset``, ``temperature``, ``gamma``, ``sigma``,
        ``printed`` = x and ``printed_denominator`` = sigma (gamma + 1) / x) and ``predicted``, ``peak_B``,
        ``target_efficiency``, ``verify_term``, ``draft_term``, ``reject_term`` at the predicted peak;
        with ``match``, ``step_ms_to_match`` and ``draft_step_ms_to_match`` (milliseconds, NaN where
        no overhead within 0-100 ms reaches x).
    """
    from moesd.paper_tables import paper_table

    rows = paper_table("tables_1_2")
    rows = rows[rows["model"].str.startswith("Qwen2")]
    for column, value in (where or {}).items():
        if column not in rows.columns:
            raise UsageError(f"where: Tables 1-2 have no column {column!r}", "where")
        rows = rows[rows[column] == value]
    rows = rows.reset_index(drop=True)
    out = []
    for _, row in rows.iterrows():
        name, gpus = _paper_device(row["device"])
        setup = Setup("qwen2-57b-a14b", "qwen2-0.5b", name, tp=gpus, context=context)
        frame = predict_sd(setup, list(batch_sizes), int(row["gamma"]), float(row["sigma"]), efficiency=efficiency)
        peak = frame.loc[frame["speedup"].idxmax()]
        result = {"table": row["table"], "device": row["device"], "dataset": row["dataset"],
                  "temperature": row["temperature"], "gamma": int(row["gamma"]), "sigma": row["sigma"],
                  "printed": row["speedup"],
                  "printed_denominator": row["sigma"] * (row["gamma"] + 1) / row["speedup"],
                  "predicted": peak["speedup"], "peak_B": int(peak["batch_size"]),
                  "target_efficiency": peak["target_efficiency"], "verify_term": peak["verify_term"],
                  "draft_term": peak["draft_term"], "reject_term": peak["reject_term"]}
        if match:
            for column, apply_to in (("step_ms_to_match", "both"), ("draft_step_ms_to_match", "draft")):
                try:
                    value = 1e3 * efficiency_to_match(row["speedup"], setup, list(batch_sizes), int(row["gamma"]),
                                                      float(row["sigma"]), efficiency=efficiency, apply_to=apply_to)
                except ValueError:
                    value = np.nan
                result[column] = value
        out.append(result)
    return pd.DataFrame(out)


#: The paper's orderings of Tables 1-2 (Sec. 8): (better setup, worse setup, the paper's reading).
PAPER_ORDERINGS = (("2xH800", "2xA800", "higher ridge point, larger speedup"),
                   ("2xA800", "4xA800", "the draft stays on one GPU while the target spreads"),
                   ("4xL40", "4xA800", "higher ridge point, larger speedup"))


def paper_orderings(comparison: pd.DataFrame) -> pd.DataFrame:
    """How often each ordering of :data:`PAPER_ORDERINGS` holds, printed and predicted.

    Pairs are rows of a :func:`paper_comparison` frame with the same dataset, temperature and gamma.
    The two rows of a pair were printed with slightly different sigma (0.90 against 0.91, say), which
    moves ``x`` by as much as the devices do; the ``*_at_equal_sigma`` counts compare the cost of a
    round instead, ``sigma (gamma + 1) / x`` (the denominator of Eq. 4, lower is better), from
    which sigma has gone.

    ``printed_p_value`` and ``printed_signed_rank_p`` ask whether the print itself shows the ordering:
    the one-sided sign test of its count at equal sigma (the chance of at least that many pairs
    holding if neither setup were better), and the one-sided Wilcoxon signed-rank test of the log
    ratios of the two rows' cost of a round (which weighs each pair by how much it differs). Both
    treat the pairs as independent, which rows printed from related runs need not be: read them
    as a guide to how strong the print's evidence is, not as exact probabilities.

    Returns
    -------
    pandas.DataFrame
        ``better``, ``worse``, ``reading``, ``pairs``, ``printed_holds``, ``predicted_holds``,
        ``printed_holds_at_equal_sigma``, ``predicted_holds_at_equal_sigma`` (counts of pairs),
        ``printed_mean_log_gain`` (the mean over the pairs of the log of the worse setup's printed cost of
        a round over the better's: about the fraction by which the better setup's rounds are cheaper),
        ``printed_p_value`` and ``printed_signed_rank_p``.
    """
    from scipy.stats import binomtest, wilcoxon

    key = ["dataset", "temperature", "gamma"]
    comparison = comparison.assign(
        predicted_denominator=comparison["sigma"] * (comparison["gamma"] + 1) / comparison["predicted"])
    out = []
    for better, worse, reading in PAPER_ORDERINGS:
        a = comparison[comparison["device"] == better].set_index(key)
        b = comparison[comparison["device"] == worse].set_index(key)
        both = a.join(b, suffixes=("_a", "_b"), how="inner")
        out.append({"better": better, "worse": worse, "reading": reading, "pairs": len(both),
                    "printed_holds": int((both["printed_a"] > both["printed_b"]).sum()),
                    "predicted_holds": int((both["predicted_a"] > both["predicted_b"]).sum()),
                    "printed_holds_at_equal_sigma": int(
                        (both["printed_denominator_a"] < both["printed_denominator_b"]).sum()),
                    "predicted_holds_at_equal_sigma": int(
                        (both["predicted_denominator_a"] < both["predicted_denominator_b"]).sum())})
        out[-1]["printed_p_value"] = (binomtest(out[-1]["printed_holds_at_equal_sigma"], len(both),
                                                alternative="greater").pvalue if len(both) else float("nan"))
        gain = np.log(both["printed_denominator_b"] / both["printed_denominator_a"])  # > 0: the ordering holds
        out[-1]["printed_mean_log_gain"] = float(gain.mean()) if len(both) else float("nan")
        out[-1]["printed_signed_rank_p"] = (float(wilcoxon(gain, alternative="greater").pvalue)
                                            if len(both) and (gain != 0).any() else float("nan"))
    return pd.DataFrame(out)


def ordering_scan(efficiencies: dict, context=256, batch_sizes=PAPER_BATCH_SIZES) -> pd.DataFrame:
    """The orderings at equal sigma, the predicted peak batch sizes and the level gap under each efficiency.

    Parameters
    ----------
    efficiencies : dict of str to Efficiency or None
        One column per entry, labelled by its key (None: the default model).
    context, batch_sizes
        As in :func:`paper_comparison`.

    Returns
    -------
    pandas.DataFrame
        One column per efficiency (of objects, so that counts stay whole numbers); rows
        ``"<better> > <worse> (of <pairs>)"`` (pairs holding at equal sigma, :func:`paper_orderings`),
        ``"orderings holding in every pair"`` (of :data:`PAPER_ORDERINGS`), ``"peak B, <device>"``
        (median over the device's rows) and ``"median predicted / printed"``.
    """
    if not isinstance(efficiencies, dict) or not efficiencies:
        raise UsageError(f"efficiencies must be a non-empty dict of label to Efficiency or None, got {efficiencies!r}", "efficiencies")
    for label, efficiency in efficiencies.items():
        if efficiency is not None and not isinstance(efficiency, Efficiency):
            raise UsageError(f"efficiencies[{label!r}] must be an Efficiency or None, got {efficiency!r}", "efficiencies")
    columns = {}
    for label, efficiency in efficiencies.items():
        frame = paper_comparison(context=context, efficiency=efficiency, batch_sizes=batch_sizes, match=False)
        orderings = paper_orderings(frame)
        held = {f"{r.better} > {r.worse} (of {r.pairs})": r.predicted_holds_at_equal_sigma
                for r in orderings.itertuples()}
        held["orderings holding in every pair"] = int(
            (orderings["predicted_holds_at_equal_sigma"] == orderings["pairs"]).sum())
        peaks = {f"peak B, {device}": int(rows["peak_B"].median()) for device, rows in frame.groupby("device")}
        columns[label] = {**held, **peaks,
                          "median predicted / printed": float((frame["predicted"] / frame["printed"]).median())}
    return pd.DataFrame({label: pd.Series(rows, dtype=object) for label, rows in columns.items()})


def model_stages(device: str, gamma: int, sigma: float, context=256, speedup=None,
                 batch_sizes=PAPER_BATCH_SIZES) -> pd.DataFrame:
    """The predicted peak of one Tables 1-2 setup as the model gains its parts, term by term.

    Stages: the data-sheet roofline (no fixed costs, no link latency); the achieved fractions of
    bandwidth and FLOP/s; the fixed cost per kernel and the link latency (the default model); and,
    when ``speedup`` (the printed x) is given, the fixed cost per forward pass that reaches it.

    Returns
    -------
    pandas.DataFrame
        One row per stage: ``stage``, ``peak``, ``peak_B``, ``verify_term``, ``draft_term``,
        ``reject_term``, ``denominator`` (their sum; ``sigma (gamma + 1) / peak``), ``t_target_1_ms``,
        ``t_draft_ms`` at the peak.
    """
    name, gpus = _paper_device(device)
    hardware = hardware_record(name)
    ideal = dataclasses.replace(hardware, bandwidth_fraction=1.0, flops_fraction=1.0, interconnect_latency=0.0)
    stages = [("data-sheet roofline", ideal, Efficiency(kernel_seconds=0.0)),
              ("+ achieved bandwidth and FLOP/s", dataclasses.replace(hardware, interconnect_latency=0.0),
               Efficiency(kernel_seconds=0.0)),
              ("+ fixed cost per kernel and link latency (default)", hardware, Efficiency())]
    if speedup is not None:
        step = efficiency_to_match(speedup, Setup("qwen2-57b-a14b", "qwen2-0.5b", hardware, tp=gpus, context=context),
                                   list(batch_sizes), gamma, sigma)
        stages.append((f"+ {1e3 * step:.1f} ms per forward pass (matches x = {speedup:g})", hardware,
                       Efficiency(step_seconds=step)))
    out = []
    for stage, hw, eff in stages:
        frame = predict_sd(Setup("qwen2-57b-a14b", "qwen2-0.5b", hw, tp=gpus, context=context), list(batch_sizes),
                           gamma, sigma, efficiency=eff)
        peak = frame.loc[frame["speedup"].idxmax()]
        out.append({"stage": stage, "peak": peak["speedup"], "peak_B": int(peak["batch_size"]),
                    "verify_term": peak["verify_term"], "draft_term": peak["draft_term"],
                    "reject_term": peak["reject_term"],
                    "denominator": peak["verify_term"] + peak["draft_term"] + peak["reject_term"],
                    "t_target_1_ms": 1e3 * peak["t_target_1"], "t_draft_ms": 1e3 * peak["t_draft"]})
    return pd.DataFrame(out)
