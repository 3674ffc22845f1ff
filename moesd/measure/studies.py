"""Reading the project's measurements: ``data/measurements/<device>/<study>.csv`` and their sidecars.

Pure pandas and JSON (no torch), so chapters can read shipped data on any machine. The folder is
``$MOESD_DATA/measurements`` (``MOESD_DATA`` defaults to the repository's ``data/``); every column of
every study, with its unit, is described in ``data/measurements/README.md``.

:func:`load` checks what it reads: complete rows, times > 0, sigma within [1/(gamma+1), 1] and the
speedup within Eq. 4's ceiling ``sigma (gamma + 1)`` (no round can emit more than ``gamma + 1``
tokens for the price of less than one decode step) up to :data:`SPEEDUP_TOLERANCE` of timing noise.
A violation is a :class:`MeasurementWarning` naming the file, the line and the field.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import numpy as np
import pandas as pd


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
            complete = json.loads(sidecar.read_text()).get("complete")
        except (OSError, json.JSONDecodeError):
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
    """A result file's rows, its sidecar and the problems :func:`check_rows` finds in the rows.

    The columns that the sidecar's engine leaves unmeasured may be empty. ValueError if the file or
    its ``.json`` sidecar cannot be read.
    """
    path = Path(path)
    try:
        frame = pd.read_csv(path)
        sidecar = json.loads(path.with_suffix(".json").read_text())
    except (OSError, UnicodeDecodeError, ValueError, pd.errors.ParserError) as error:
        raise ValueError(f"{path} (or its .json sidecar) cannot be read as a result file: {error}") from None
    nullable = (*NULLABLE_COLUMNS, *ENGINE_UNMEASURED.get(sidecar.get("engine"), ()))
    return frame, sidecar, check_rows(frame, nullable)


def check_rows(frame: pd.DataFrame, nullable=NULLABLE_COLUMNS) -> list[str]:
    """Physical and completeness problems of result rows, one message per row and field.

    Checks: no empty cell outside ``nullable`` (default :data:`NULLABLE_COLUMNS`); times (:data:`TIME_COLUMNS`) > 0;
    ``sigma`` in [1/(gamma+1), 1]; ``speedup <= sigma (gamma + 1) (1 + SPEEDUP_TOLERANCE)``.
    Lines are those of the CSV file (the header is line 1).
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
    if {"sigma", "gamma", "speedup"} <= set(frame.columns):
        ceiling = frame["sigma"] * (frame["gamma"] + 1)
        def above_ceiling(row):
            efficiency = row.get("target_efficiency", np.nan)
            measured = "" if pd.isna(efficiency) else f"; this row's target efficiency is {efficiency:.3g}"
            return (f"speedup = {row['speedup']:.4g} exceeds sigma (gamma + 1) = "
                    f"{row['sigma'] * (row['gamma'] + 1):.4g} by more than {SPEEDUP_TOLERANCE:.0%}, which Eq. 4 "
                    f"allows only if verifying gamma + 1 tokens took less time than a one-token step{measured}")

        report(frame["speedup"] > ceiling * (1 + SPEEDUP_TOLERANCE), above_ceiling)
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
