"""Reading the project's measurements: ``data/measurements/<device>/<study>.csv`` and their sidecars.

Pure pandas and JSON (no torch), so chapters can read shipped data on any machine. The folder is
``$MOESD_DATA/measurements`` (``MOESD_DATA`` defaults to the repository's ``data/``); every column of
every study, with its unit, is described in ``data/measurements/README.md``.

:func:`load` checks what it reads: complete rows, times > 0, sigma within [1/(gamma+1), 1], the
speedup within Eq. 4's ceiling ``sigma (gamma + 1)`` (no round can emit more than ``gamma + 1``
tokens for the price of less than one decode step) up to :data:`SPEEDUP_TOLERANCE` of timing noise,
no point measured twice, and a sidecar that says the sweep finished. A violation is a
:class:`MeasurementWarning` naming the file, the line and the field. Every reader of result files
takes its rows from :func:`read_rows` (which drops a last line cut mid-way, as a write stopped part-way
leaves it) and its sidecar from :func:`read_sidecar` (which refuses a malformed one, naming the key).
"""

from __future__ import annotations

import io
import json
import os
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from moesd._checks import as_array
from moesd._files import read_json, regular_file


SPEEDUP_TOLERANCE = 0.02
"""Relative timing noise allowed above Eq. 4's ceiling ``sigma (gamma + 1)`` before a row is flagged."""

TIME_COLUMNS = ("seconds", "t_ar", "t_sd", "t_target_1", "t_target_gamma", "t_draft", "t_reject")
"""Columns in seconds, which must be > 0."""

NULLABLE_COLUMNS = ("num_experts_per_tok", "sigma_target", "alpha", "activated_experts", "activated_experts_1",
                    "activated_experts_gamma")
"""Columns that may be empty (dense targets have no K and no experts, nor draft rows; real acceptance has no
target sigma)."""

ENGINE_UNMEASURED = {"vllm": ("t_target_1", "t_target_gamma", "t_draft", "t_reject", "speedup_eq4",
                              "target_efficiency", "activated_experts_1", "activated_experts_gamma")}
"""Columns an engine other than moesd's own cannot measure (its sidecar's ``engine``): left empty in its rows."""

POINT_COLUMNS = ("num_experts_per_tok", "dataset", "temperature", "run", "role", "batch_size", "tokens", "gamma")
"""Columns that identify a measured point (those a result file has): one row per point."""

ROOFLINE_NUMBERS = ("peak_flops", "memory_bandwidth", "memory_bytes")
"""Numbers (> 0) a sidecar's measured roofline (``hardware``) must hold: FLOP/s, bytes/s and bytes."""


class MeasurementWarning(UserWarning):
    """A loaded result file holds a row that breaks a physical bound or is incomplete."""


def measurements_dir() -> Path:
    """The measurements folder: ``$MOESD_DATA/measurements``, read when called."""
    default = Path(__file__).resolve().parents[2] / "data"
    return Path(os.environ.get("MOESD_DATA", default)) / "measurements"


MEASUREMENTS_DIR = measurements_dir()
"""The measurements folder when moesd was imported (prefer :func:`measurements_dir`)."""


def available(study: str | None = None, directory=None) -> list[tuple[str, str]]:
    """(device, study) pairs with a finished result file, sorted; only ``study`` if given."""
    pairs = []
    for sidecar in sorted(Path(directory or measurements_dir()).glob("*/*.json")):
        try:
            complete = read_sidecar(sidecar).get("complete")
        except (OSError, ValueError):
            continue
        if complete and sidecar.with_suffix(".csv").exists() and study in (None, sidecar.stem):
            pairs.append((sidecar.parent.name, sidecar.stem))
    return pairs


def load(study: str, device: str = "cpu", directory=None) -> tuple[pd.DataFrame, dict]:
    """A study's rows and its sidecar (environment and settings), checked by :func:`check_rows`.

    Parameters
    ----------
    study : str
        ``forward``, ``e2e``, ``sparsity``, ``dense``, ``dense_forward`` or ``settings``.
    device : str
        The device folder (``cpu``, ``h100``...).
    directory : path, optional
        The measurements folder (default :func:`measurements_dir`).

    Raises
    ------
    FileNotFoundError
        If the study was not measured on that device; the message lists what was.
    ValueError
        If the result file or its sidecar cannot be read.
    """
    directory = Path(directory or measurements_dir())
    path = directory / device / f"{study}.csv"
    if not path.exists():
        known = ", ".join(f"{d}/{s}" for d, s in available(directory=directory)) or "none"
        raise FileNotFoundError(f"no {study} study measured on {device} (available: {known}); "
                                f"run `moesd sweep {study}` to measure it")
    frame, sidecar, problems = check_file(path)
    for problem in problems:
        warnings.warn(f"{device}/{path.name}: {problem}", MeasurementWarning, stacklevel=2)
    return frame, sidecar


def check_file(path) -> tuple[pd.DataFrame, dict, list[str]]:
    """A result file's rows (:func:`read_rows`), its sidecar (:func:`read_sidecar`) and their problems.

    The problems are those :func:`check_rows` finds in the rows (the columns that the sidecar's engine
    leaves unmeasured may be empty) and a sidecar saying ``complete: false``.

    Raises
    ------
    ValueError
        If the file or its ``.json`` sidecar is missing, not a regular file, or cannot be read; the
        message names the file (and the key of a malformed sidecar).
    """
    path = Path(path)
    frame, sidecar = read_rows(path), read_sidecar(path.with_suffix(".json"))
    nullable = (*NULLABLE_COLUMNS, *ENGINE_UNMEASURED.get(sidecar.get("engine"), ()))
    unfinished = [] if sidecar.get("complete", True) else [
        f"its sidecar says complete: false: the sweep stopped before its last point ({len(frame)} rows); run "
        "the same `moesd sweep` again to finish it"]
    return frame, sidecar, unfinished + check_rows(frame, nullable)


def read_rows(path) -> pd.DataFrame:
    """The rows of a result file, without a last line cut mid-way.

    A sweep rewrites its file whole after every point, so a last line without its newline is what a
    write stopped part-way (a kill, a full disk) leaves: it is dropped with a :class:`MeasurementWarning`
    naming the file and the line.

    Raises
    ------
    ValueError
        If ``path`` is missing, not a regular file (a FIFO would block), or not a readable CSV file.
    """
    path = regular_file("result file", path)
    try:
        lines = path.read_text().splitlines(keepends=True)
    except UnicodeDecodeError as error:
        raise ValueError(f"{path} is not a readable CSV file ({error})") from None
    if len(lines) > 1 and not lines[-1].endswith("\n"):
        warnings.warn(f"{path}: dropped line {len(lines)}, cut mid-line (no newline at its end, as a write stopped "
                      "part-way leaves it)", MeasurementWarning, stacklevel=2)
        lines = lines[:-1]
    try:
        return pd.read_csv(io.StringIO("".join(lines)))
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as error:
        raise ValueError(f"{path} is not a readable CSV file ({str(error).splitlines()[0]})") from None


def read_sidecar(path) -> dict:
    """A result file's JSON sidecar, with the parts readers rely on checked.

    It must be a JSON object; ``settings``, ``acceptance`` and ``hardware`` objects where present,
    ``complete`` true or false, and a measured roofline (``hardware``) must hold the numbers of
    :data:`ROOFLINE_NUMBERS`, each > 0.

    Raises
    ------
    ValueError
        If ``path`` is missing, not a regular file, not JSON, or malformed; the message names the file
        and the key.
    """
    path = regular_file("sidecar", path)
    try:
        sidecar = read_json("sidecar", path)
    except ValueError as error:
        raise ValueError(f"{error}; it cannot be read as a result file's sidecar") from None
    if not isinstance(sidecar, dict):
        raise ValueError(f"{path} must hold a JSON object (a sidecar of moesd sweep), got a "
                         f"{type(sidecar).__name__}")
    for key in ("settings", "acceptance", "hardware"):
        if key in sidecar and not isinstance(sidecar[key], dict) and not (key == "hardware" and sidecar[key] is None):
            raise ValueError(f"{path}: {key} must be a JSON object, got {json.dumps(sidecar[key])[:60]}")
    if not isinstance(sidecar.get("complete", False), bool):
        raise ValueError(f"{path}: complete must be true or false, got {json.dumps(sidecar['complete'])[:60]}")
    if sidecar.get("hardware"):
        missing = [key for key in ROOFLINE_NUMBERS if key not in sidecar["hardware"]]
        if missing:
            raise ValueError(f"{path}: hardware (the measured roofline) lacks {', '.join(missing)}")
        for key in ROOFLINE_NUMBERS:
            as_array(f"{path}: hardware.{key}", sidecar["hardware"][key], low=0, low_open=True)
    return sidecar


def repeated_points(frame: pd.DataFrame) -> dict[int, int]:
    """Rows that repeat an earlier row's point (:data:`POINT_COLUMNS`): ``{index: index of the first}``."""
    keys = [column for column in POINT_COLUMNS if column in frame]
    if not keys or frame.empty:
        return {}
    first = pd.Series(np.arange(len(frame))).groupby([frame[c].to_numpy() for c in keys], dropna=False).transform("min")
    return {int(i): int(first.iloc[i]) for i in np.flatnonzero(first.to_numpy() != np.arange(len(frame)))}


def above_ceiling(frame: pd.DataFrame) -> np.ndarray:
    """Rows whose speedup exceeds Eq. 4's ceiling ``sigma (gamma + 1)`` by more than :data:`SPEEDUP_TOLERANCE`.

    Only rows with numbers in the three columns and sigma within [1/(gamma+1), 1] are judged (a sigma
    outside is a problem of its own).
    """
    if not {"sigma", "gamma", "speedup"} <= set(frame.columns):
        return np.zeros(len(frame), bool)
    sigma, gamma, speedup = (pd.to_numeric(frame[c], errors="coerce") for c in ("sigma", "gamma", "speedup"))
    judged = (sigma >= 1 / (gamma + 1) - 1e-9) & (sigma <= 1 + 1e-9)
    return np.asarray(judged & (speedup > sigma * (gamma + 1) * (1 + SPEEDUP_TOLERANCE)))


def check_rows(frame: pd.DataFrame, nullable=NULLABLE_COLUMNS) -> list[str]:
    """Physical and completeness problems of result rows, one message per row and field.

    Checks: no empty cell outside ``nullable`` (default :data:`NULLABLE_COLUMNS`); times (:data:`TIME_COLUMNS`) > 0;
    ``sigma`` in [1/(gamma+1), 1]; ``speedup <= sigma (gamma + 1) (1 + SPEEDUP_TOLERANCE)``
    (:func:`above_ceiling`); no point twice (:func:`repeated_points`). Lines are those of the CSV file
    (the header is line 1).
    """
    problems = []

    def report(mask, message):
        for index in np.flatnonzero(np.asarray(mask)):
            row = frame.iloc[index]
            where = ", ".join(f"{c}={row[c]:g}" if isinstance(row[c], (int, float, np.number)) else f"{c}={row[c]}"
                              for c in ("run", "batch_size", "gamma", "num_experts_per_tok", "tokens", "role")
                              if c in frame and not pd.isna(row[c]))
            problems.append(f"line {index + 2} ({where}): {message(row)}")

    required = [c for c in frame.columns if c not in nullable]
    for column in required:
        report(frame[column].isna(), lambda row, c=column: f"{c} is empty")
    for column in (c for c in TIME_COLUMNS if c in frame):
        report(frame[column] <= 0, lambda row, c=column: f"{c} = {row[c]:g} s is not > 0")
    if {"sigma", "gamma"} <= set(frame.columns):
        low = 1 / (frame["gamma"] + 1)
        report((frame["sigma"] < low - 1e-9) | (frame["sigma"] > 1 + 1e-9),
               lambda row: f"sigma = {row['sigma']:.4g} lies outside [1/(gamma+1), 1]")
    def too_fast(row):
        efficiency = row.get("target_efficiency", np.nan)
        measured = "" if pd.isna(efficiency) else f"; this row's target efficiency is {efficiency:.3g}"
        return (f"speedup = {row['speedup']:.4g} exceeds sigma (gamma + 1) = "
                f"{row['sigma'] * (row['gamma'] + 1):.4g} by more than {SPEEDUP_TOLERANCE:.0%}, which Eq. 4 "
                f"allows only if verifying gamma + 1 tokens took less time than a one-token step{measured}")

    report(above_ceiling(frame), too_fast)
    repeats = repeated_points(frame)
    report(np.isin(np.arange(len(frame)), list(repeats)),
           lambda row: f"repeats the point of line {repeats[frame.index.get_loc(row.name)] + 2} (a row copied twice?)")
    return problems


def summarize(frame: pd.DataFrame, by: list[str], value: str) -> pd.DataFrame:
    """Median and interquartile range of ``value`` over repeats, grouped by ``by``."""
    grouped = frame.groupby(by)[value]
    return pd.DataFrame({"median": grouped.median(), "q25": grouped.quantile(0.25),
                         "q75": grouped.quantile(0.75), "runs": grouped.size()}).reset_index()


def provenance(sidecar: dict) -> str:
    """One line saying where a study's numbers come from, for figure captions."""
    settings = sidecar.get("settings", {})
    acceptance = sidecar.get("acceptance", {})
    if acceptance.get("mode") == "synthetic" and "workloads" in acceptance:
        accept = f"synthetic acceptance at the sigma of {len(acceptance['workloads'])} workloads of paper Table 1"
    elif acceptance.get("mode") == "synthetic":
        sigma = ", ".join(f"{v:g}" for v in acceptance.get("sigma", {}).values())
        accept = f"synthetic acceptance (sigma {sigma} for gamma {', '.join(acceptance.get('sigma', {}))})"
    elif acceptance.get("mode") == "none":
        accept = "forward passes" + (" timed as CUDA graph replays" if settings.get("cuda_graphs") else "")
    else:
        accept = "real acceptance"
    shape = f"{settings.get('target')}"
    if settings.get("layers") or settings.get("width", 1) < 1:
        layers = settings.get("layers") or "all"
        shape += f" shape ({layers} layer{'' if layers == 1 else 's'}, widths x {settings.get('width', 1):g})"
    return f"{sidecar.get('device')}, {sidecar.get('weights')} weights, {shape}, {accept}; moesd.measure.bench"


def sidecar_summary(sidecar: dict) -> dict:
    """What a study's sidecar says about how it was measured, one entry per setting, for a table of studies.

    Returns
    -------
    dict
        Device, torch threads, dtype, weights, acceptance mode, protocol, routing, the pair and its layers,
        width, vocabulary, context, timed rounds, repeats, the 1-minute load average at the start, rows and
        whether the study is complete (None where the sidecar has no such setting).
    """
    s = sidecar["settings"]
    return {"device": sidecar["device"], "torch threads": sidecar["cpu_threads"], "dtype": s["dtype"],
            "weights": sidecar["weights"], "acceptance": sidecar["acceptance"]["mode"],
            "protocol": sidecar["protocol"], "routing": s.get("routing"),
            "target / draft": f"{s['target']} / {s['draft']}",
            "layers (target / draft)": f"{s['layers']} / {s['draft_layers']}", "width": s["width"],
            "vocabulary": s.get("vocab_size"), "context": s["context"], "timed rounds": s["rounds"],
            "repeats": s["repeats"], "load average at start (1 min)": (sidecar.get("load_average") or [None])[0],
            "rows": sidecar["rows"], "complete": sidecar["complete"]}
