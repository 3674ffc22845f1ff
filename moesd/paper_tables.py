"""The paper's printed numbers, read from ``data/paper/``.

Every value in these files was printed in the paper (or, for ``models.csv``, in the public
model configs and cards), and each row says where. They are reference values, never
measurements of this project.

* ``tables_1_2``: Tables 1-2, one row per (model, device, dataset, temperature, gamma) with
  ``T_AR``, ``T_SD``, ``sigma`` and the peak ``speedup``.
* ``table_3``: Table 3, the fitting-robustness study (``m``, ``stride``, ``mse``, ...).
* ``models``: the paper's models, their parameter counts and sources; their architectures' dimensions are joined
  from the package's shipped model records (:func:`moesd.zoo.paper_dimensions`), the one source of model dimensions.
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from moesd._checks import one_of

DATA_DIR = Path(os.environ.get("MOESD_DATA", Path(__file__).resolve().parents[1] / "data"))
"""The project's ``data/`` folder; set ``MOESD_DATA`` to read another."""

PAPER_TABLES = ("tables_1_2", "table_3", "models")

_COLUMNS = {
    "tables_1_2": ("table", "model", "device", "dataset", "temperature", "gamma", "T_AR", "T_SD", "sigma",
                   "speedup", "source"),
    "table_3": ("m", "stride", "mse", "source"),
    "models": ("model", "hub_id", "total_params", "active_params", "config_source", "params_source"),
}
"""Columns each table must have (the chapters and tests read them)."""


def paper_table(name: str) -> pd.DataFrame:
    """Load one of the paper's tables.

    Parameters
    ----------
    name : {"tables_1_2", "table_3", "models"}
        Which table.

    Returns
    -------
    pandas.DataFrame
        The table, with a ``source`` column (or ``config_source`` and ``params_source``)
        citing where each row stands in the paper or the model's public files.

    Raises
    ------
    ValueError
        For an unknown ``name``, or a file that is not a CSV table with the table's columns.
    FileNotFoundError
        When ``data/paper/`` (or ``MOESD_DATA``'s) has no such file.
    """
    one_of("name", name, PAPER_TABLES)
    path = DATA_DIR / "paper" / f"{name}.csv"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: install moesd from its repository "
                                "(pip install -e .) or set MOESD_DATA to its data/ folder")
    try:
        table = pd.read_csv(path)
    except (ValueError, UnicodeDecodeError) as error:  # pandas' parser errors are ValueErrors
        raise ValueError(f"{path}: not a readable CSV table ({error})") from error
    missing = [c for c in _COLUMNS[name] if c not in table.columns]
    if missing:
        raise ValueError(f"{path}: not the paper's {name}: it lacks the column(s) {', '.join(missing)}")
    if name == "models":
        table = _with_dimensions(table)
    counts = [c for c in table.columns if c.startswith("num_") or c.endswith("_size")]
    return table.astype({c: "Int64" for c in counts})


def _with_dimensions(models: pd.DataFrame) -> pd.DataFrame:
    """The paper's model table with each model's dimensions (:data:`moesd.zoo.PAPER_DIMENSIONS`) from its shipped
    record, found by hub id, after the ``role`` column."""
    from moesd.zoo import PAPER_DIMENSIONS, get_model, paper_dimensions

    dimensions = pd.DataFrame([paper_dimensions(get_model(hub_id)) for hub_id in models["hub_id"]],
                              columns=list(PAPER_DIMENSIONS), index=models.index, dtype=float)
    at = list(models.columns).index("role") + 1 if "role" in models.columns else 2
    return pd.concat([models.iloc[:, :at], dimensions, models.iloc[:, at:]], axis=1)
