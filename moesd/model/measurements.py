"""Measured speedups as Algorithm 1's fit takes them: the fitting frame, its checks and its inputs.

A fitting frame has one row per measured point and the columns :data:`COLUMNS` (batch size, draft
length, experts per token and per layer, sigma, speedup). :func:`read_result_file` reads the rows of an
e2e or sparsity result file of :mod:`moesd.measure.bench` and refuses rows a fit must not take silently,
:func:`from_sweep` builds the frame from them, :func:`mean_over_repeats` turns a file measured in
several repeats into one point per batch size, gamma and K (as the paper averages its runs), and
:func:`sigma_adjusted_speedup` rescales speedups to one acceptance (Sec. 4.2). :func:`check_measurements`
and :func:`measurement_array` validate a frame; :func:`speedup_inputs` turns its rows into the
parameter-free :class:`moesd.model.algorithm1.SpeedupInputs` that the fit and its diagnostics evaluate.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from moesd._checks import UsageError, as_array
from moesd.model.algorithm1 import SpeedupInputs

__all__ = ["COLUMNS", "read_result_file", "from_sweep", "mean_over_repeats", "sigma_adjusted_speedup", "check_measurements",
           "measurement_array", "speedup_inputs"]


COLUMNS = ("B", "gamma", "K", "E", "sigma", "speedup")
"""Columns of a fitting frame: batch size, draft length, experts per token, experts per layer,
sigma (Eq. 5) and measured speedup."""


def read_result_file(path, allow_incomplete: bool = False,
                     allow_above_ceiling: bool = False) -> tuple[pd.DataFrame, dict | None]:
    """The rows of an e2e or sparsity result file that Algorithm 1 may be fitted to, and its sidecar.

    Rows come from :func:`moesd.measure.studies.read_rows` (a last line cut mid-way is dropped with a
    warning), the sidecar (None when there is none) from :func:`moesd.measure.studies.read_sidecar`.

    Parameters
    ----------
    path : str or os.PathLike
        The result file (``<study>.csv``; its sidecar is the ``.json`` beside it).
    allow_incomplete : bool
        Take the rows of a sweep whose sidecar says ``complete: false`` (it stopped part-way).
    allow_above_ceiling : bool
        Take rows whose speedup exceeds Eq. 4's ceiling ``sigma (gamma + 1)`` by more than
        :data:`moesd.measure.studies.SPEEDUP_TOLERANCE` (:func:`moesd.measure.studies.above_ceiling`).

    Raises
    ------
    ValueError
        Naming the file (and the line and column, or the sidecar's key) for a file that is not a regular
        file or not readable, a malformed sidecar, a forward or dense study, a missing column, an empty
        or non-finite cell of :data:`moesd.measure.analysis.FITTING_COLUMNS`, a point in two rows, and,
        unless allowed, an unfinished sweep or a speedup above Eq. 4's ceiling.
    """
    from moesd.measure.analysis import FITTING_COLUMNS
    from moesd.measure.studies import above_ceiling, read_rows, read_sidecar, repeated_points

    rows = read_rows(path)
    sidecar_path = Path(path).with_suffix(".json")
    sidecar = read_sidecar(sidecar_path) if sidecar_path.exists() else None
    if {"role", "tokens", "seconds"} <= set(rows.columns):
        raise UsageError(f"{path} is a forward study (stage times per forward, no speedups); Algorithm 1 is fitted "
                         "to an e2e or sparsity result file (e2e.csv or sparsity.csv beside it, or measure one with "
                         "`moesd sweep sparsity`)", "path")
    missing = [column for column in FITTING_COLUMNS if column not in rows.columns]
    if missing:
        raise UsageError(f"{path} lacks the column(s) {', '.join(missing)}; Algorithm 1 is fitted to the e2e or "
                         "sparsity result files of `moesd sweep`", "path")
    if rows["num_experts_per_tok"].isna().all():
        raise UsageError(f"{path} has no experts per token (a dense target?); Algorithm 1 fits an MoE target", "path")
    for column in FITTING_COLUMNS:
        values = pd.to_numeric(rows[column], errors="coerce").to_numpy(dtype=float)
        bad = np.flatnonzero(~np.isfinite(values) & rows[column].map(lambda v: isinstance(v, (int, float))))
        if bad.size:
            raise UsageError(f"{path}: line {bad[0] + 2}, column {column} is {rows[column].iloc[bad[0]]} (empty or "
                             "not finite); Algorithm 1 needs a number in every row", "path")
    if sidecar is not None and sidecar.get("complete") is False and not allow_incomplete:
        raise UsageError(f"{sidecar_path} says complete: false: the sweep stopped before its last point; finish it "
                         "by running the same `moesd sweep` again, or pass allow_incomplete=True "
                         "(--allow-incomplete) to fit the rows it has", "allow_incomplete")
    repeats = repeated_points(rows)
    if repeats:
        index, first = next(iter(repeats.items()))
        raise UsageError(f"{path}: line {index + 2} repeats the point of line {first + 2} (a row copied twice?); "
                         "remove one of them", "path")
    high = np.flatnonzero(above_ceiling(rows))
    if high.size and not allow_above_ceiling:
        row = rows.iloc[high[0]]
        raise UsageError(f"{path}: line {high[0] + 2} (and {high.size - 1} more): speedup = {row['speedup']:.4g} "
                         f"exceeds Eq. 4's ceiling sigma (gamma + 1) = {row['sigma'] * (row['gamma'] + 1):.4g}; "
                         "pass allow_above_ceiling=True (--allow-above-ceiling) to fit such rows anyway", "allow_above_ceiling")
    return rows, sidecar


def from_sweep(rows: pd.DataFrame, num_experts: int) -> pd.DataFrame:
    """The fitting frame (columns :data:`COLUMNS`) of an e2e or sparsity result file of :mod:`moesd.measure.bench`."""
    missing = [c for c in ("batch_size", "gamma", "num_experts_per_tok", "sigma", "speedup") if c not in rows]
    if missing:
        raise UsageError(f"rows lack the column(s) {', '.join(missing)} of an e2e or sparsity result file", "rows")
    num_experts = int(as_array("num_experts", num_experts, low=1, whole=True))
    return pd.DataFrame({"B": rows["batch_size"], "gamma": rows["gamma"], "K": rows["num_experts_per_tok"],
                         "E": num_experts, "sigma": rows["sigma"], "speedup": rows["speedup"]})


def mean_over_repeats(rows: pd.DataFrame, errors=("speedup",)) -> pd.DataFrame:
    """One row per point of a result file measured in several repeats: each numeric column's mean over them.

    A point is a (``batch_size``, ``gamma``, ``num_experts_per_tok``) of an e2e-type result file of
    :mod:`moesd.measure.bench`; the paper's points are likewise means over runs (the last 5 of 10, Sec. 4).
    Speedups and sigma are averaged as measured (the mean of the repeats' ratios), stage times in
    seconds likewise; ``run`` and ``seed`` are dropped.

    Parameters
    ----------
    rows : pandas.DataFrame
        The rows of a result file, one per repeat and point.
    errors : sequence of str
        Columns whose standard error of the mean is added as ``<column>_se`` (the sample standard
        deviation over the repeats over the square root of their number; NaN for a single repeat).

    Returns
    -------
    pandas.DataFrame
        The point's columns, the mean of every other numeric column, the ``<column>_se`` of ``errors``
        and ``runs`` (the repeats averaged), sorted by the point's columns, with a fresh index.
    """
    if not isinstance(rows, pd.DataFrame):
        raise UsageError(f"rows must be a pandas DataFrame, got {type(rows).__name__}", "rows")
    missing = [c for c in ("batch_size", "gamma", *errors) if c not in rows]
    if missing:
        raise UsageError(f"rows lack the column(s) {', '.join(missing)} of an e2e-type result file", "rows")
    keys = [c for c in ("batch_size", "gamma", "num_experts_per_tok") if c in rows]
    numeric = [c for c in rows.select_dtypes("number").columns if c not in (*keys, "run", "seed")]
    groups = rows.groupby(keys, dropna=False)
    table = groups[numeric].mean()
    table["runs"] = groups.size()
    for column in errors:
        table[f"{column}_se"] = groups[column].std(ddof=1) / np.sqrt(table["runs"])
    return table.reset_index()


def sigma_adjusted_speedup(frame: pd.DataFrame, reference_k: int = 8) -> pd.Series:
    """Speedups rescaled by ``sigma_{K=reference_k} / sigma_K`` (Sec. 4.2 of the paper).

    Editing K without retraining changes acceptance; the paper compares K by rescaling each run with
    the mean sigma of its (K, gamma) group against that of ``K = reference_k`` at the same gamma.
    """
    group_sigma = frame.groupby(["K", "gamma"])["sigma"].transform("mean")
    reference = frame[frame["K"] == reference_k]
    if reference.empty:
        raise UsageError(f"no measurement with K = {reference_k} to rescale against", "reference_k")
    reference_sigma = frame["gamma"].map(reference.groupby("gamma")["sigma"].mean())
    return frame["speedup"] * reference_sigma / group_sigma


def check_measurements(frame: pd.DataFrame) -> pd.DataFrame:
    """Validate a frame of measurements (columns :data:`COLUMNS`), raising ValueError on bad rows."""
    measurement_array(frame)
    return frame


def measurement_array(frame: pd.DataFrame) -> np.ndarray:
    """The checked :data:`COLUMNS` of a frame of measurements as a float array, one row per measurement.

    Parameters
    ----------
    frame : pandas.DataFrame
        Measurements with the columns :data:`COLUMNS` (numbers, or text that reads as numbers).

    Returns
    -------
    numpy.ndarray
        Shape ``(rows, 6)``, in :data:`COLUMNS` order: B (sequences), gamma (tokens), K and E (experts),
        sigma and speedup (dimensionless).

    Raises
    ------
    ValueError
        When a column is missing, holds text, NaN or an infinity, or a value is out of range (B, gamma >= 1,
        1 <= K <= E, sigma in [1/(gamma+1), 1] of Eq. 5, speedup > 0); the message names the column and
        the row (the frame's index label) of the first bad cell.
    """
    if not isinstance(frame, pd.DataFrame):
        raise UsageError(f"measurements must be a pandas DataFrame, got {type(frame).__name__}", "measurements")
    missing = [column for column in COLUMNS if column not in frame.columns]
    if missing:
        raise UsageError(f"measurements lack the column(s) {', '.join(missing)}", "measurements")
    values = frame[list(COLUMNS)]
    if not all(pd.api.types.is_numeric_dtype(dtype) for dtype in values.dtypes):
        for column in COLUMNS:
            numbers = pd.to_numeric(values[column], errors="coerce")
            text = numbers.isna() & values[column].notna()
            if text.any():
                label = text.idxmax()
                raise UsageError(f"measurements column {column} holds {values[column][label]!r} (row {label}), "
                                 "not a number", "measurements")
        values = values.apply(pd.to_numeric)
    array = values.to_numpy(dtype=float)

    def where(bad: np.ndarray, column: str) -> str:  # the first offending cell, by column and row label
        row = np.flatnonzero(bad)[0]
        return f"column {column} holds {array[row, COLUMNS.index(column)]:g} (row {frame.index[row]})"

    if not np.isfinite(array).all():
        bad = [column for column, wrong in zip(COLUMNS, ~np.isfinite(array).all(axis=0)) if wrong]
        kind = "NaN" if np.isnan(array).any() else "infinite values"
        raise UsageError(f"measurements have {kind} in {', '.join(bad)}: "
                         f"{where(~np.isfinite(array[:, COLUMNS.index(bad[0])]), bad[0])}", "measurements")
    B, gamma, K, E, sigma, speedup = array.T
    for column, values in (("B", B), ("gamma", gamma)):
        if (values < 1).any():
            raise UsageError(f"B and gamma must be >= 1: {where(values < 1, column)}", column)
    for column, bad in (("K", (K < 1) | (K > E)), ("sigma", (sigma < 1 / (gamma + 1) - 1e-9) | (sigma > 1)),
                        ("speedup", speedup <= 0)):
        if bad.any():
            rule = {"K": "K must be in [1, E]", "sigma": "sigma must be in [1/(gamma+1), 1] (Eq. 5)",
                    "speedup": "speedup must be > 0"}[column]
            raise UsageError(f"{rule}: {where(bad, column)}", column)
    return array


def speedup_inputs(frame: pd.DataFrame, rp: float, verify_tokens, array: np.ndarray | None = None) -> SpeedupInputs:
    """:class:`~moesd.model.algorithm1.SpeedupInputs` of the rows of a fitting frame.

    Parameters
    ----------
    frame : pandas.DataFrame
        A fitting frame (columns B, gamma, K, E, sigma of :data:`COLUMNS`).
    rp : float
        Ridge point in tokens (G's transition is at ``lam * rp`` tokens).
    verify_tokens : {"gamma", "gamma+1"} or None
        Tokens per sequence in the verification forward (see :func:`moesd.model.algorithm1.compute_speedup`).
    array : numpy.ndarray, optional
        The frame's :func:`measurement_array`, when already at hand (its columns are used instead of
        the frame's).

    Returns
    -------
    SpeedupInputs
        The parameter-free part of the model for every row.
    """
    if array is None:
        array = frame[list(COLUMNS[:5])].to_numpy(dtype=float)
    return SpeedupInputs.build(*array[:, :5].T, rp, verify_tokens)
