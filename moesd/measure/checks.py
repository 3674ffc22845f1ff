"""What the chapter *Measuring SD* checks about the shipped studies, in tables: the protocol against the study's
own settings (:func:`protocol_checks`, :func:`sigma_standard_error`), the regime (:func:`regime_steps`,
:func:`doubling_tokens`, :func:`expert_products_seconds`, :func:`streaming_shares`, :func:`expert_read_seconds`),
the forward study's step against the activated experts (:func:`step_against_experts`, :func:`expert_cost_fit`)
and how long each study took (:func:`study_durations`). The figures that draw them are in
:mod:`moesd.plots.measuring_sd`.
"""

from __future__ import annotations

import datetime

import numpy as np
import pandas as pd


def sigma_standard_error(alpha: float, gamma: int, sequence_rounds) -> float:
    """Standard error of the mean of points' measured sigma under synthetic acceptance.

    A sequence-round emits ``min(G, gamma) + 1`` tokens, ``G`` geometric (each draft token accepted
    with probability ``alpha``), so a point of ``n`` sequence-rounds measures sigma with variance
    ``var(tokens) / n / (gamma + 1)**2``. The mean of ``m`` such points, each with its own coins, has
    the standard error ``sqrt(sum_i var(tokens) / n_i) / m / (gamma + 1)``.

    Parameters
    ----------
    alpha : float
        Per-token acceptance probability, in [0, 1].
    gamma : int
        Draft tokens per round.
    sequence_rounds : sequence of int
        ``B x rounds`` of each point averaged.

    Returns
    -------
    float
        The standard error (a fraction, like sigma).
    """
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha must be in [0, 1], got {alpha!r}")
    accepted = np.arange(gamma + 1)
    chance = np.append(alpha ** accepted[:-1] * (1 - alpha), alpha ** gamma)
    variance = max(float((chance * (accepted + 1) ** 2).sum() - ((chance * (accepted + 1)).sum()) ** 2), 0.0)
    counts = np.asarray(sequence_rounds, dtype=float)
    return float(np.sqrt((variance / counts).sum()) / len(counts) / (gamma + 1))


def protocol_checks(e2e: pd.DataFrame, sidecar: dict, small_batch: int = 4) -> pd.DataFrame:
    """The steady-state checks of an e2e-type study, per gamma.

    Parameters
    ----------
    e2e : pandas.DataFrame
        The study's rows (``gamma``, ``batch_size``, ``rounds``, ``ar_steps``, ``warmup_rounds``,
        ``speedup``, ``speedup_eq4``, ``sigma``, ``sigma_target``, ``alpha``).
    sidecar : dict
        Its sidecar: ``settings`` hold the ``rounds`` and ``warmup_rounds`` every point should have.
    small_batch : int
        The sigma bias is taken over the points with ``B <= small_batch`` (few sequences, few coins).

    Returns
    -------
    pandas.DataFrame
        Indexed by gamma: ``rows``; ``rounds asked`` (settings); ``points with those rounds``: rows whose
        timed SD rounds and AR steps both equal the asked rounds and whose warm-up rounds equal the
        asked warm-up; ``speedup / Eq. 4, min`` and ``max``; ``mean sigma, B <= n`` and ``target sigma``;
        ``sigma bias`` (their difference), its ``standard error`` (:func:`sigma_standard_error` with the
        rows' ``alpha``) and ``bias / standard error``.
    """
    settings = sidecar["settings"]
    asked, warmup = int(settings["rounds"]), int(settings["warmup_rounds"])
    full = (e2e["rounds"] == asked) & (e2e["ar_steps"] == asked) & (e2e["warmup_rounds"] == warmup)
    ratio = e2e["speedup"] / e2e["speedup_eq4"]
    by = e2e.groupby("gamma")
    small = e2e[e2e["batch_size"] <= small_batch].groupby("gamma")
    table = pd.DataFrame({"rows": by.size(), "rounds asked": asked,
                          "points with those rounds": full.groupby(e2e["gamma"]).sum(),
                          "speedup / Eq. 4, min": ratio.groupby(e2e["gamma"]).min(),
                          "speedup / Eq. 4, max": ratio.groupby(e2e["gamma"]).max(),
                          f"mean sigma, B <= {small_batch}": small["sigma"].mean(),
                          "target sigma": small["sigma_target"].first()})
    table["sigma bias"] = table[f"mean sigma, B <= {small_batch}"] - table["target sigma"]
    table["standard error"] = [
        sigma_standard_error(float(part["alpha"].iloc[0]), int(gamma), part["batch_size"] * part["rounds"])
        for gamma, part in small]
    table["bias / standard error"] = table["sigma bias"] / table["standard error"]
    return table


def regime_steps(check) -> pd.DataFrame:
    """The regime check's ``B = 1`` steps in readable units, one row per model and dtype.

    Parameters
    ----------
    check : moesd.measure.regime.RegimeCheck

    Returns
    -------
    pandas.DataFrame
        Indexed by ``model`` and ``dtype``: ``step (ms)``, ``bytes (GB)`` (read by the step), ``bytes /
        step (GB/s)`` (the rate the step reads them), ``STREAM (GB/s)`` (measured in that dtype's run),
        ``products read (GB/s)`` (the bytes the step's matrix products read over their seconds),
        ``streaming share``, ``products share``, ``dispatch share``.
    """
    steps = check.steps.set_index(["model", "dtype"])
    return pd.DataFrame({"step (ms)": 1e3 * steps["step_seconds"], "bytes (GB)": steps["bytes"] / 1e9,
                         "bytes / step (GB/s)": steps["bytes"] / steps["step_seconds"] / 1e9,
                         "STREAM (GB/s)": steps["bandwidth"] / 1e9,
                         "products read (GB/s)": steps["products_bandwidth"] / 1e9,
                         "streaming share": steps["streaming_share"], "products share": steps["products_share"],
                         "dispatch share": steps["dispatch_share"]})


def doubling_tokens(check) -> pd.DataFrame:
    """Per projection and dtype of the regime check: the fewest tokens M whose product takes twice M = 1's time.

    A memory-bound product costs about the same for a few tokens as for one (its weight is read once);
    the M at which its time has doubled is where the flat part of its roofline ends. A one-token
    kernel jump (a fast matrix-vector kernel at M = 1, a slower matrix-matrix one from M = 2) shows as
    a doubling at M = 2.

    Returns
    -------
    pandas.DataFrame
        Indexed by ``projection``; one column per dtype: the M (tokens), NaN when no measured M doubles.
    """
    rows = {}
    for (projection, dtype), part in check.gemm.groupby(["projection", "dtype"], sort=False):
        part = part.sort_values("tokens")
        one = float(part.loc[part["tokens"] == 1, "median_seconds"].iloc[0])
        doubled = part.loc[part["median_seconds"] >= 2 * one, "tokens"]
        rows.setdefault(projection, {})[dtype] = float(doubled.iloc[0]) if len(doubled) else np.nan
    return pd.DataFrame(rows).T.rename_axis("projection")


def expert_products_seconds(check, model: str = "qwen2-57b-a14b", tokens: int = 1) -> pd.Series:
    """Seconds of one routed expert's three products (gate, up, down) at ``tokens`` tokens, per dtype.

    Read from the regime check's GEMM curves of ``"<model> expert gate/up"`` (gate and up share a
    shape: counted twice) and ``"<model> expert down"``, weights read from memory.

    Returns
    -------
    pandas.Series
        Seconds (s), indexed by dtype.
    """
    gemm = check.gemm[check.gemm["tokens"] == tokens].set_index(["projection", "dtype"])["median_seconds"]
    gate_up, down = gemm.loc[f"{model} expert gate/up"], gemm.loc[f"{model} expert down"]
    return (2 * gate_up + down).rename("seconds")


def streaming_shares(studies: dict) -> pd.DataFrame:
    """The streaming share of each study's smallest-batch target step, read from its sidecar.

    Where a sidecar predates the ``streaming_share`` key, it is computed the way the sweeps now
    record it (:func:`moesd.measure.regime.measured_streaming_share` of the rows and sidecar), and the
    ``source`` column says so.

    Parameters
    ----------
    studies : dict
        Label -> ``(rows, sidecar)`` of a result file (:func:`moesd.measure.studies.load`).

    Returns
    -------
    pandas.DataFrame
        Indexed by label: ``dtype``, ``width``, ``layers``, ``CUDA graphs``, ``step (ms)`` (the median
        ``T_T(B, 1)`` at the smallest B), ``bytes (GB)``, ``bandwidth (GB/s)`` (the sidecar's STREAM),
        ``streaming share``, ``source``.
    """
    from moesd.measure.regime import measured_streaming_share

    rows = {}
    for label, (frame, sidecar) in studies.items():
        share, source = sidecar.get("streaming_share"), "sidecar"
        if not share:
            share, source = measured_streaming_share(frame, sidecar), "computed from the rows"
        settings = sidecar["settings"]
        rows[label] = {"dtype": settings.get("dtype"), "width": settings.get("width"),
                       "layers": settings.get("layers"), "CUDA graphs": bool(settings.get("cuda_graphs")),
                       "step (ms)": 1e3 * share["step_seconds"], "bytes (GB)": share["bytes"] / 1e9,
                       "bandwidth (GB/s)": share["bandwidth"] / 1e9, "streaming share": share["share"],
                       "source": source}
    return pd.DataFrame(rows).T.infer_objects()


def expert_read_seconds(sidecar: dict, rate: float | None = None) -> float:
    """Seconds one routed expert's weights take to read at a rate (default: the sidecar's STREAM bandwidth).

    Parameters
    ----------
    sidecar : dict
        A study's sidecar (its target's shapes at the study's width, its dtype and measured roofline).
    rate : float, optional
        Bytes per second (e.g. the rate a matrix-vector product reads its weight).

    Returns
    -------
    float
        Seconds (s).
    """
    from moesd.measure.analysis import measured_shapes, measuring_hardware

    target, _ = measured_shapes(sidecar)
    if not target.expert_params:
        raise ValueError("sidecar: the study's target has no routed experts")
    size = {"float32": 4, "bfloat16": 2, "float16": 2}[sidecar["settings"]["dtype"]]
    bandwidth = measuring_hardware(sidecar).memory_bandwidth if rate is None else rate
    return target.expert_params * size / bandwidth


def step_against_experts(forward: pd.DataFrame) -> pd.DataFrame:
    """A forward study's decode steps against the experts they activated, per batch size.

    Parameters
    ----------
    forward : pandas.DataFrame
        A forward study with ``activated_experts`` on its target rows (sweeps with routing control).

    Returns
    -------
    pandas.DataFrame
        Indexed by ``batch_size``: ``activated_experts`` (mean over repeats of the distinct experts a
        ``T_T(B, 1)`` forward activated, per MoE layer), ``target_s`` (median ``T_T(B, 1)``, s),
        ``target_low`` and ``target_high`` (its quartiles over repeats), ``draft_s`` (median ``T_D(B, 1)``).
    """
    steps = forward[forward["tokens"] == 1]
    target = steps[steps["role"] == "target"].groupby("batch_size")
    draft = steps[steps["role"] == "draft"].groupby("batch_size")["seconds"]
    if target["activated_experts"].count().eq(0).any():
        raise ValueError("forward: target rows lack activated_experts (a study without routing control)")
    return pd.DataFrame({"activated_experts": target["activated_experts"].mean(),
                         "target_s": target["seconds"].median(), "target_low": target["seconds"].quantile(0.25),
                         "target_high": target["seconds"].quantile(0.75), "draft_s": draft.median()})


def expert_cost_fit(steps: pd.DataFrame, moe_layers: int = 1) -> dict:
    """Least squares ``T_T(B, 1) = fixed + per_expert N(B) moe_layers + per_token B`` over batch sizes.

    Parameters
    ----------
    steps : pandas.DataFrame
        :func:`step_against_experts`'s table (``activated_experts``, ``target_s``; index B).
    moe_layers : int
        MoE layers of the target (``activated_experts`` is per layer).

    Returns
    -------
    dict
        ``fixed_s``, ``per_expert_s`` (per activated expert and layer), ``per_token_s`` (seconds) and
        ``largest_residual`` (the largest ``|fit / measured - 1|`` over the batch sizes).
    """
    experts = steps["activated_experts"].to_numpy(float) * moe_layers
    batch = steps.index.to_numpy(float)
    design = np.column_stack([np.ones_like(batch), experts, batch])
    measured = steps["target_s"].to_numpy(float)
    coefficients = np.linalg.lstsq(design, measured, rcond=None)[0]
    fitted = design @ coefficients
    return {"fixed_s": float(coefficients[0]), "per_expert_s": float(coefficients[1]),
            "per_token_s": float(coefficients[2]), "largest_residual": float(np.abs(fitted / measured - 1).max())}


def study_durations(starts: dict) -> pd.DataFrame:
    """How long each study of one measuring session ran, from the start dates its sidecars record.

    A sidecar records when its sweep started (``date``), not when it ended, so a study's duration is
    bounded by the next study's start: the table gives that difference, which includes building the
    next study's models and any pause between the two, as an upper bound. The last study has none.

    Parameters
    ----------
    starts : dict
        Study name -> ISO date of its start (a sidecar's ``date``, or the regime check's).

    Returns
    -------
    pandas.DataFrame
        Indexed by study, in order of start: ``started`` (UTC, ``HH:MM``), ``minutes, at most`` (until
        the next start; NaN for the last).
    """
    dates = pd.Series({name: datetime.datetime.fromisoformat(date) for name, date in starts.items()}).sort_values()
    minutes = (dates.shift(-1) - dates).dt.total_seconds() / 60
    return pd.DataFrame({"started": dates.dt.strftime("%Y-%m-%d %H:%M"), "minutes, at most": minutes})
