"""Reading the project's measurements: ``data/measurements/<device>/<study>.csv`` and their sidecars.

Pure pandas and JSON (no torch), so chapters can read shipped data on any machine.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from moesd.paper import DATA_DIR
from moesd.roofline import Hardware

MEASUREMENTS_DIR = DATA_DIR / "measurements"


def available(study: str | None = None) -> list[tuple[str, str]]:
    """(device, study) pairs with a finished result file, sorted; only ``study`` if given."""
    pairs = []
    for sidecar in sorted(MEASUREMENTS_DIR.glob("*/*.json")):
        if json.loads(sidecar.read_text()).get("complete") and sidecar.with_suffix(".csv").exists():
            if study in (None, sidecar.stem):
                pairs.append((sidecar.parent.name, sidecar.stem))
    return pairs


def load(study: str, device: str = "cpu") -> tuple[pd.DataFrame, dict]:
    """A study's rows and its sidecar (environment and settings).

    Raises
    ------
    FileNotFoundError
        If the study was not measured on that device; the message lists what was.
    """
    path = MEASUREMENTS_DIR / device / f"{study}.csv"
    if not path.exists():
        known = ", ".join(f"{d}/{s}" for d, s in available()) or "none"
        raise FileNotFoundError(f"no {study} study measured on {device} (available: {known}); "
                                f"run `moesd sweep {study}` to measure it")
    return pd.read_csv(path), json.loads(Path(path).with_suffix(".json").read_text())


def provenance(sidecar: dict) -> str:
    """One line saying where a study's numbers come from, for figure captions."""
    settings = sidecar.get("settings", {})
    acceptance = sidecar.get("acceptance", {})
    if acceptance.get("mode") == "synthetic":
        sigma = ", ".join(f"{v:g}" for v in acceptance.get("sigma", {}).values())
        accept = f"synthetic acceptance (sigma {sigma} for gamma {', '.join(acceptance.get('sigma', {}))})"
    else:
        accept = "real acceptance"
    shape = f"{settings.get('target')}"
    if settings.get("layers") or settings.get("width", 1) < 1:
        shape += f" shape ({settings.get('layers') or 'all'} layers, widths x {settings.get('width', 1):g})"
    return f"{sidecar.get('device')}, {sidecar.get('weights')} weights, {shape}, {accept}; moesd.bench"


def forward_target_efficiency(forward: pd.DataFrame, gammas=(2, 3, 4)) -> pd.DataFrame:
    """Target efficiency ``T_T(B, 1) / T_T(B, gamma)`` from a forward study, per batch size.

    The verification pass scores ``gamma + 1`` positions per sequence (as vLLM and :mod:`moesd.sd` do).
    Medians over repeats; ``low`` and ``high`` divide the quartiles crosswise (a conservative band).

    Returns
    -------
    pandas.DataFrame
        Columns ``batch_size``, ``gamma``, ``efficiency``, ``low``, ``high``.
    """
    times = forward[forward["role"] == "target"].groupby(["tokens", "batch_size"])["seconds"]
    median, q25, q75 = times.median(), times.quantile(0.25), times.quantile(0.75)
    parts = []
    for gamma in gammas:
        if gamma + 1 not in median.index.get_level_values("tokens"):
            raise ValueError(f"the forward study has no pass of {gamma + 1} tokens per sequence")
        parts.append(pd.DataFrame({"gamma": gamma, "efficiency": median[1] / median[gamma + 1],
                                   "low": q25[1] / q75[gamma + 1], "high": q75[1] / q25[gamma + 1]}))
    return pd.concat(parts).reset_index()


def measuring_hardware(sidecar: dict) -> Hardware:
    """The measured roofline of the device that produced a result file (its sidecar's ``hardware``).

    Raises
    ------
    ValueError
        If the sidecar holds no measured roofline (a sweep from before moesd recorded one).
    """
    record = sidecar.get("hardware")
    if not record:
        raise ValueError(f"the sidecar of this result file ({sidecar.get('device', 'unknown device')}, "
                         f"{sidecar.get('date', 'undated')}) holds no measured roofline; re-run the sweep "
                         "with this version of moesd, or pass the ridge point yourself")
    return Hardware.from_dict(record)


def ridge_point_for(sidecar: dict) -> float:
    """Ridge point (FLOP/byte) of the device that produced a result file, from its measured roofline."""
    return measuring_hardware(sidecar).ridge_point
