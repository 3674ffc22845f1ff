"""The paper's printed numbers, read from ``data/paper/``.

Every value in these files was printed in the paper (or, for ``models.csv``, in the public
model configs and cards), and each row says where. They are reference values, never
measurements of this project.

* ``tables_1_2``: Tables 1-2, one row per (model, device, dataset, temperature, gamma) with
  ``T_AR``, ``T_SD``, ``sigma`` and the peak ``speedup``.
* ``table_3``: Table 3, the fitting-robustness study (``m``, ``stride``, ``mse``, ...).
* ``models``: the paper's models and their architectures.
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

DATA_DIR = Path(os.environ.get("MOESD_DATA", Path(__file__).resolve().parents[1] / "data"))
"""The project's ``data/`` folder; set ``MOESD_DATA`` to read another."""

PAPER_TABLES = ("tables_1_2", "table_3", "models")


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
    """
    if name not in PAPER_TABLES:
        raise ValueError(f"name must be one of {PAPER_TABLES}, got {name!r}")
    path = DATA_DIR / "paper" / f"{name}.csv"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: install moesd from its repository "
                                "(pip install -e .) or set MOESD_DATA to its data/ folder")
    table = pd.read_csv(path)
    counts = [c for c in table.columns if c.startswith("num_") or c.endswith("_size")]
    return table.astype({c: "Int64" for c in counts})
