"""A sweep's result file: ``<study>.csv`` with its JSON sidecar of the environment, resumable and never
silently replaced.

Results go to ``<out_dir>/<study>.csv`` (default ``$MOESD_DATA/measurements/<device>/``), rewritten
atomically after every point together with a JSON sidecar of the environment (:func:`environment`:
device, software, commit, command, the measured roofline of :mod:`moesd.measure.hardware`). A sweep
that stops part-way resumes where it stopped when run again with the same settings: a row cut
mid-line or incomplete is dropped (:func:`read_complete_rows`) and its point measured again. A
finished result file is never replaced without ``overwrite=True`` (:func:`check_sweep`), and even then
only once the new sweep is complete: until then it goes to a partial file beside it (:func:`writing_file`).
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from moesd._checks import UsageError, torch_device, writable_folder
from moesd._files import atomic_write
from moesd.measure.hardware import cpu_name, device_memory_bytes, measured_roofline
from moesd.measure.studies import NULLABLE_COLUMNS, measurements_dir, read_rows, read_sidecar, repeated_points
from moesd.measure.sweeps import FORWARD_STUDIES, SweepConfig, check_memory, gpu_label, routing_provenance
from moesd.theory.speedup import alpha_from_sigma
from moesd.zoo import default_experts_implementation, get_model


def environment(config: SweepConfig) -> dict:
    """Device, software and provenance of a sweep, for its JSON sidecar."""
    device = torch.device(config.device)
    if device.type == "cuda":
        properties = torch.cuda.get_device_properties(device)
        name, memory = properties.name, properties.total_memory
        driver = _command(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    else:
        name, memory, driver = cpu_name(), None, None
    if config.study in FORWARD_STUDIES:
        acceptance = {"mode": "none"}
    elif config.study == "settings":
        acceptance = {"mode": "synthetic", "workloads": [
            {**w, "sigma": {str(g): s for g, s in w["sigma"].items()},
             "alpha": {str(g): float(alpha_from_sigma(s, g)) for g, s in w["sigma"].items()}}
            for w in config.workloads]}
    elif config.sigma == "real":
        acceptance = {"mode": "real"}
    else:
        acceptance = {"mode": "synthetic", "sigma": {str(g): s for g, s in config.sigma.items()},
                      "alpha": {str(g): float(alpha_from_sigma(s, g)) for g, s in config.sigma.items()}}
    return {
        "device": name, "device_memory_bytes": memory, "driver": driver, "cuda": torch.version.cuda,
        "cpu_threads": torch.get_num_threads(), "load_average": _load_average(), "python": platform.python_version(),
        "torch": torch.__version__, "transformers": _version("transformers"),
        # MOESD_COMMIT names the commit of a copy whose .git is missing or stale (the GPU machine's was stale)
        "commit": (os.environ.get("MOESD_COMMIT")
                   or _command(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent)),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": _invocation(sys.argv), "weights": config.weights, "acceptance": acceptance,
        "protocol": "forward passes" if config.study in FORWARD_STUDIES else "steady state",
        "experts_implementation": (default_experts_implementation(device) if get_model(config.target).is_moe
                                   else None),
        **({"routing_source": routing_provenance(config)} if config.routing == "popularity" else {}),
        # the measured roofline of this device in the sweep's dtype and threads: "hardware" (ridge point) and curves
        **measured_roofline(config.device, config.dtype).sidecar_entries(),
    }


def _invocation(argv: list) -> str:
    """The command line of this process; ``python -c`` running the CLI (as tools/gpu_run.py does) reads as ``moesd``."""
    return shlex.join(["moesd", *argv[1:]] if argv[:1] == ["-c"] else argv)


def _command(arguments, cwd=None) -> str | None:
    try:
        return subprocess.run(arguments, capture_output=True, text=True, check=True, cwd=cwd).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def _load_average() -> list | None:
    """The machine's load averages over 1, 5 and 15 minutes (None where the system keeps none)."""
    try:
        return [round(value, 2) for value in os.getloadavg()]
    except OSError:
        return None


def check_device(device: str) -> None:
    """Refuse a device this machine does not have (:class:`~moesd._checks.UsageError` naming it)."""
    torch_device("device", device)


def device_label(device: str) -> str:
    """A folder name for a device: the GPU's name (``h100``, ``h200``...) or ``cpu``."""
    if torch.device(device).type != "cuda":
        return "cpu"
    return gpu_label(torch.cuda.get_device_name(torch.device(device)))


def check_sweep(config: SweepConfig, out_dir=None, overwrite: bool = False) -> Path:
    """The result file a sweep will write, after every check that needs no model.

    The device must be here and hold the models' weights and KV caches (:func:`~moesd.measure.sweeps.check_memory`),
    the folder (default ``$MOESD_DATA/measurements/<device>``) writable, and
    an existing result file (or the partial file of a sweep replacing it) resumable (see :func:`writing_file`)
    unless ``overwrite``.

    Raises
    ------
    UsageError
        A ``ValueError`` for a missing device, a folder that is a file or read-only, or a result file
        or sidecar that is not a regular file.
    FileExistsError
        If the result file holds a finished sweep or one with other settings and ``overwrite`` is False.
    """
    check_device(config.device)
    check_memory(config, device_memory_bytes(config.device), config.device)
    folder = out_dir if out_dir is not None else measurements_dir() / device_label(config.device)
    path = writable_folder("out_dir", folder) / f"{config.study}.csv"
    writing_file(path, config, overwrite)
    return path


def partial_file(path) -> Path:
    """Where a sweep replacing the result file ``path`` (``overwrite``) writes until it is complete:
    ``.<study>.partial.csv`` beside it, with its sidecar ``.<study>.partial.json``."""
    path = Path(path)
    return path.with_name(f".{path.stem}.partial{path.suffix}")


def writing_file(path, config: SweepConfig, overwrite: bool = False) -> tuple[Path, bool]:
    """The file a sweep of the result file ``path`` writes its rows to, and whether it resumes rows from it.

    A sweep writes ``path`` itself, except when ``overwrite`` replaces an existing one: then it writes
    :func:`partial_file` and moves it onto ``path`` only when complete (:meth:`ResultFile.finish`), so
    that until then ``path`` keeps every row it had. Without ``overwrite``, a partial file of the same
    settings (the sweep that would replace ``path`` was stopped) is resumed.

    Raises
    ------
    UsageError, FileExistsError
        As :func:`check_sweep` does, for ``path`` or for a partial file of other settings.
    """
    path = Path(path)
    partial = partial_file(path)
    _finish_swap(path)
    if not overwrite and partial.exists() and _resumable(partial, config, False):
        return partial, True
    resume = _resumable(path, config, overwrite)
    return (partial if path.exists() and not resume else path), resume


def _finish_swap(path: Path) -> None:
    """Move a complete partial file and its sidecar onto ``path`` where a stop cut :meth:`ResultFile.finish`
    between the two (only a complete sweep's partial sidecar says ``"complete": true``)."""
    partial = partial_file(path)
    try:
        complete = json.loads(partial.with_suffix(".json").read_text()).get("complete")
    except (OSError, json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return
    if complete is True:
        if partial.exists():
            os.replace(partial, path)
        os.replace(partial.with_suffix(".json"), path.with_suffix(".json"))


def _key(row: dict, columns) -> tuple:
    """A row's key with missing values as None and numbers as floats (CSV round trips change types)."""
    values = []
    for column in columns:
        value = row.get(column)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            values.append(None)
        elif isinstance(value, (int, float, np.integer, np.floating)):
            values.append(float(value))
        else:
            values.append(value)
    return tuple(values)


def read_complete_rows(path, nullable=NULLABLE_COLUMNS) -> list[dict]:
    """The complete rows of a result CSV; a line cut mid-way or a row with empty cells is dropped.

    A row is complete when its line ends with a newline (:func:`moesd.measure.studies.read_rows`), it
    has the header's number of fields, and no cell outside ``nullable`` (default
    :data:`NULLABLE_COLUMNS`) is empty. A point found in several rows (a row copied by hand) keeps none
    of them. Each dropped row is named in a warning; its point is measured again.
    """
    frame = read_rows(path)
    required = [column for column in frame.columns if column not in nullable]
    incomplete = frame[required].isna().any(axis=1).to_numpy().copy()
    for index in np.flatnonzero(incomplete):
        warnings.warn(f"{path}: dropped data row {index + 1}, which has empty cells; its point will be "
                      "measured again", stacklevel=2)
    repeats = repeated_points(frame)
    for index, first in repeats.items():
        warnings.warn(f"{path}: dropped data rows {first + 1} and {index + 1}, which hold the same point; it will "
                      "be measured again", stacklevel=2)
    incomplete[[*repeats, *repeats.values()]] = True
    return frame[~incomplete].to_dict("records")


def _resumable(path: Path, config: SweepConfig, overwrite: bool) -> bool:
    """Whether ``path`` holds rows to resume from; refuse what must not be replaced (see :func:`check_sweep`)."""
    sidecar = path.with_suffix(".json")
    for file in (path, sidecar):
        if file.exists() and not file.is_file():
            raise UsageError(f"{file} is not a regular file; choose another out_dir")
    if overwrite or not path.exists():
        return False
    elsewhere = "pass overwrite (--overwrite) to replace it, or write elsewhere (out_dir, --out-dir or MOESD_DATA)"
    try:
        previous = read_sidecar(sidecar)
    except ValueError as error:  # missing, cut or malformed: judge the rows by the settings they record
        return _resumable_without_sidecar(path, config, str(error), elsewhere)
    if previous.get("complete"):
        raise FileExistsError(f"{path} holds a finished sweep; {elsewhere}")
    if previous.get("settings") != config.settings():
        raise FileExistsError(f"{path} holds a sweep with other settings; {elsewhere}")
    return True


def _resumable_without_sidecar(path: Path, config: SweepConfig, problem: str, elsewhere: str) -> bool:
    """Resume ``path`` whose sidecar is ``problem`` (missing, cut, malformed) when its rows are this sweep's.

    Each row records its point and its ``context`` (and ``rounds``, ``warmup_rounds`` in e2e-type
    studies): when all lie in ``config``'s grid, the rows are kept with a warning (the sidecar is
    written anew at the next point); the models and dtype, which only the sidecar records, cannot be checked.

    Raises
    ------
    FileExistsError
        Naming the sidecar's problem and a row setting that differs from ``config``'s.
    """
    rows = pd.DataFrame(read_complete_rows(path))
    grid = {"context": (config.context,), "batch_size": config.batch_sizes, "run": range(config.repeats),
            "num_experts_per_tok": config.top_k_values}
    if config.study in FORWARD_STUDIES:
        grid["tokens"] = {1, *config.gammas, *(g + 1 for g in config.gammas)}
    else:
        grid.update(gamma=config.gammas, rounds=(config.rounds,), warmup_rounds=(config.warmup_rounds,))
    for column, allowed in grid.items() if not rows.empty else ():
        allowed = {_key({column: value}, [column]) for value in allowed}
        other = ([] if column not in rows else
                 [value for value in rows[column].unique() if _key({column: value}, [column]) not in allowed])
        if column not in rows or other:
            what = f"no {column} column" if column not in rows else f"{column} {other[0]}, not this sweep's"
            raise FileExistsError(f"{problem}; the rows of {path} were measured with other settings ({what}), so "
                                  f"they cannot be resumed: {elsewhere}")
    warnings.warn(f"{problem}: resuming from the {len(rows)} row(s) of {path.name}, whose points, context and "
                  "rounds are this sweep's; the sidecar is written anew at the next point. The models and dtype "
                  "of those rows cannot be checked without it: if they are not this command's, stop and pass "
                  "overwrite (--overwrite)", stacklevel=3)
    return True


class ResultFile:
    """``<study>.csv`` plus its ``.json`` sidecar: resumable, written atomically, never silently replaced.

    Rows go to :attr:`writing` (see :func:`writing_file`): ``path``, or its partial file while a sweep
    replaces ``path``. Each point rewrites the sidecar first and then the CSV, each atomically, so a stop
    between the two leaves a sidecar of the same settings one point ahead (the point is measured again),
    never rows without their sidecar; ``"complete": true`` is written only after the last row.
    """

    nullable = NULLABLE_COLUMNS
    """Columns a complete row may leave empty (an engine that cannot measure a column adds it)."""

    def __init__(self, path, config: SweepConfig, overwrite: bool = False):
        self.path, self.config, self.columns = Path(path), config, config.key_columns()
        self.writing, resume = writing_file(self.path, config, overwrite)
        self.sidecar = self.writing.with_suffix(".json")
        if overwrite:  # what an earlier overwrite left before it completed
            for file in (partial_file(self.path), partial_file(self.path).with_suffix(".json")):
                file.unlink(missing_ok=True)
        rows = read_complete_rows(self.writing, self.nullable) if resume else []
        self.rows = {_key(row, self.columns): row for row in rows}
        self.environment = environment(config)
        self.earlier_runs = _earlier_runs(self.sidecar) if rows else []

    def done(self, keys) -> bool:
        """Whether every key (a dict of key-column values) already has a row: a resumed sweep skips it."""
        return all(_key(key, self.columns) in self.rows for key in keys)

    def add(self, rows: list[dict]) -> None:
        """Add (or replace) one point's rows and rewrite both files atomically, the sidecar first."""
        for row in rows:
            self.rows[_key(row, self.columns)] = row
        self._write_sidecar(False)
        with atomic_write(self.writing, "w") as file:
            pd.DataFrame(list(self.rows.values())).to_csv(file, index=False)

    def finish(self, expected_keys) -> None:
        """Mark the sweep complete once every expected key has a complete row; move a partial file onto
        :attr:`path` (the CSV, then its sidecar: :func:`writing_file` finishes a move a stop cut)."""
        missing = [key for key in expected_keys if _key(key, self.columns) not in self.rows]
        if missing:
            raise RuntimeError(f"{self.writing}: {len(missing)} point(s) not measured, e.g. {missing[0]}")
        self._write_sidecar(True)
        _finish_swap(self.path)

    def _write_sidecar(self, complete: bool) -> None:
        from moesd.measure.regime import measured_streaming_share

        sidecar = {**self.environment, "settings": self.config.settings(), "complete": complete,
                   "rows": len(self.rows), "load_average_now": _load_average(),
                   **({"earlier_runs": self.earlier_runs} if self.earlier_runs else {})}
        share = measured_streaming_share(pd.DataFrame(list(self.rows.values())), sidecar)
        with atomic_write(self.sidecar, "w") as file:
            json.dump({**sidecar, **({"streaming_share": share} if share else {})}, file, indent=2)


EARLIER_RUN_FIELDS = ("date", "commit", "command", "device", "driver", "cuda", "torch", "transformers", "rows")
"""What a resumed sweep's sidecar keeps of each earlier run (the top-level fields describe the last)."""


def _earlier_runs(sidecar: Path) -> list[dict]:
    """The runs a resumed result file's rows came from: the earlier sidecar's history and its own run."""
    try:
        previous = read_sidecar(sidecar)
    except ValueError:
        return []
    return previous.get("earlier_runs", []) + [{name: previous.get(name) for name in EARLIER_RUN_FIELDS}]
