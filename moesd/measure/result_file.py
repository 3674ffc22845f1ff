"""A sweep's result file: ``<study>.csv`` with its JSON sidecar of the environment, resumable and never
silently replaced.

Results go to ``<out_dir>/<study>.csv`` (default ``$MOESD_DATA/measurements/<device>/``), rewritten
atomically after every point together with a JSON sidecar of the environment (:func:`environment`:
device, software, commit, command, the measured roofline of :mod:`moesd.measure.hardware`). A sweep
that stops part-way resumes where it stopped when run again with the same settings: every row it keeps
is checked against the sweep first, and a file holding another's is refused naming the line
(:func:`check_kept_rows`); a row cut mid-line or incomplete is dropped (:func:`read_complete_rows`) and
its point measured again. A finished result file is never replaced without ``overwrite=True``
(:func:`check_sweep`), and even then only once the new sweep is complete: until then it goes to a partial
file beside it, which only another ``overwrite`` resumes (:func:`writing_file`). A write that fails
mid-sweep raises :class:`SweepWriteError`, saying what the file keeps.
"""

from __future__ import annotations

import contextlib
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
from moesd.measure.sweep_checks import check_pretrained
from moesd.measure.sweep_memory import check_memory
from moesd.measure.sweeps import FORWARD_STUDIES, SweepConfig, gpu_label, routing_provenance
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

    The device must be here and hold the models' weights and KV caches
    (:func:`~moesd.measure.sweep_memory.check_memory`), pretrained models loadable (:func:`~moesd.measure.sweep_checks.check_pretrained`), the folder (default
    ``$MOESD_DATA/measurements/<device>``) writable, and an existing result file (or the partial file of a
    sweep replacing it) resumable (see :func:`writing_file`) unless ``overwrite``.

    Raises
    ------
    UsageError
        A ``ValueError`` for a missing device, a folder that is a file or read-only, or a result file
        or sidecar that is not a regular file.
    FileExistsError
        If the result file holds a finished sweep or one with other settings and ``overwrite`` is False.
    """
    check_device(config.device)
    check_pretrained(config)
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
    that until then ``path`` keeps every row it had. A partial file of the same settings (an ``overwrite``
    that was stopped) is resumed by the next ``overwrite``; one of other settings is dropped by it. Without
    ``overwrite`` a partial file is refused, naming the command that finishes it: the sweep it would
    complete replaces ``path``, which only ``overwrite`` may do.

    Raises
    ------
    UsageError, FileExistsError
        As :func:`check_sweep` does, for ``path`` or for a partial file.
    """
    path = Path(path)
    partial = partial_file(path)
    _finish_swap(path)
    if partial.exists():
        try:
            resume = _resumable(partial, config, False)
        except FileExistsError:
            if not overwrite:
                raise
            return partial, False  # another sweep's partial file: this overwrite replaces it
        if overwrite:
            return partial, resume
        raise FileExistsError(_unfinished_overwrite(path, partial))
    resume = _resumable(path, config, overwrite)
    return (partial if path.exists() and not resume else path), resume


def _unfinished_overwrite(path: Path, partial: Path) -> str:
    """Why a sweep without ``overwrite`` leaves ``partial`` (of its own settings) alone, and how to finish it."""
    sidecar = read_sidecar(partial.with_suffix(".json"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rows = len(read_complete_rows(partial))
    command = sidecar.get("command")
    finish = f"`{command}`" if isinstance(command, str) and "--overwrite" in command.split() else \
        "the same sweep with overwrite (--overwrite)"
    return (f"{partial} holds {rows} row(s) of a sweep that was replacing {path.name} (overwrite, --overwrite) "
            f"and stopped part-way; {path.name} keeps its rows until that sweep completes. Finish it with {finish}, "
            f"or remove {partial.name} and {partial.with_suffix('.json').name} to drop it")


def _finish_swap(path: Path) -> None:
    """Move a complete partial file and its sidecar onto ``path`` where a stop cut :meth:`ResultFile.finish`
    between the two (only a complete sweep's partial sidecar says ``"complete": true``)."""
    partial = partial_file(path)
    try:
        complete = read_sidecar(partial.with_suffix(".json")).get("complete")
    except (OSError, ValueError):
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
    """Whether ``path`` holds rows to resume from; refuse what must not be replaced or resumed (see
    :func:`check_sweep`): the rows a resume would keep are checked against the sweep (:func:`check_kept_rows`)."""
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
    check_kept_rows(path, config, elsewhere)
    return True


def _resumable_without_sidecar(path: Path, config: SweepConfig, problem: str, elsewhere: str) -> bool:
    """Resume ``path`` whose sidecar is ``problem`` (missing, cut, malformed) when its rows are this sweep's.

    Each row records its point and its ``context`` (and ``rounds``, ``warmup_rounds`` in e2e-type
    studies): when all lie in ``config``'s grid (:func:`check_kept_rows`), the rows are kept with a warning (the
    sidecar is written anew at the next point); the models and dtype, which only the sidecar records, cannot be
    checked.

    Raises
    ------
    FileExistsError
        Naming the sidecar's problem and a row setting that differs from ``config``'s.
    """
    check_kept_rows(path, config, elsewhere, f"{problem}; ")
    rows = read_complete_rows(path)
    warnings.warn(f"{problem}: resuming from the {len(rows)} row(s) of {path.name}, whose points, context and "
                  "rounds are this sweep's; the sidecar is written anew at the next point. The models and dtype "
                  "of those rows cannot be checked without it: if they are not this command's, stop and pass "
                  "overwrite (--overwrite)", stacklevel=3)
    return True


def sweep_grid(config: SweepConfig) -> dict:
    """The values each column of a sweep's rows may take: its points (:meth:`SweepConfig.key_columns`), its
    ``context`` and, in e2e-type studies, its ``rounds`` and ``warmup_rounds`` (None: an empty cell)."""
    grid = {"run": range(config.repeats), "batch_size": config.batch_sizes,
            "num_experts_per_tok": config.top_k_values, "context": (config.context,)}
    if config.study in FORWARD_STUDIES:
        return {**grid, "role": ("target", "draft"), "tokens": {1, *config.gammas, *(g + 1 for g in config.gammas)}}
    grid.update(gamma=config.gammas, rounds=(config.rounds,), warmup_rounds=(config.warmup_rounds,))
    if config.workloads:
        grid.update(dataset={w["dataset"] for w in config.workloads},
                    temperature={w["temperature"] for w in config.workloads})
    return grid


def study_times(config: SweepConfig) -> tuple:
    """The columns of seconds a sweep's rows hold (each a number > 0)."""
    return ("seconds",) if config.study in FORWARD_STUDIES else (
        "t_ar", "t_sd", "t_target_1", "t_target_gamma", "t_draft", "t_reject")


def check_kept_rows(path: Path, config: SweepConfig, elsewhere: str, problem: str = "") -> None:
    """Refuse a result file whose rows a resume of ``config`` must not keep, naming the file and the line.

    Every row must have the sweep's columns (its point, ``context``, its times), a point and a ``context``
    (``rounds``, ``warmup_rounds``) in the sweep's grid (:func:`sweep_grid`), numbers where numbers belong and
    times (:func:`study_times`) that are finite and > 0. An empty file, a second header or a row of another
    study is refused too. Rows cut mid-line, with empty cells or holding a point twice are not refused: they
    are dropped with a warning and measured again (:func:`read_complete_rows`).

    Raises
    ------
    FileExistsError
        ``problem`` (what is wrong with the sidecar, if anything), the file, the line (the header is line 1),
        the column and the value, and ``elsewhere`` (how to replace the file instead).
    """
    def refuse(what: str):
        raise FileExistsError(f"{problem}{path}: {what}, so its rows are not this sweep's to resume: {elsewhere}")

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # read_complete_rows warns of the rows it drops
            frame = read_rows(path)
    except ValueError as error:
        refuse(f"cannot be read as a result file ({str(error).split(' (')[-1].rstrip(')')})")
    grid, times = sweep_grid(config), study_times(config)
    missing = [column for column in (*grid, *times) if column not in frame and column not in ("dataset", "temperature")]
    if missing:
        refuse(f"the header lacks {', '.join(missing)} of the {config.study} study's rows")
    for column, allowed in grid.items():
        if column not in frame:
            continue
        known = {_key({column: value}, [column]) for value in allowed}
        for index, value in enumerate(frame[column]):
            empty = value is None or (isinstance(value, float) and math.isnan(value))
            if empty and None not in known:
                continue  # an empty cell: the row is dropped and measured again
            number = pd.to_numeric(pd.Series([value]), errors="coerce").iloc[0] if column not in (
                "role", "dataset") else value
            if _key({column: number}, [column]) not in known:
                shown = ", ".join(sorted(map(str, allowed))) if len(allowed) <= 8 else f"{len(allowed)} values"
                refuse(f"line {index + 2} has {column} {_cell(value)!r}, not one of this sweep's ({shown})")
    for column in times:
        values = pd.to_numeric(frame[column], errors="coerce")
        bad = frame[column].notna() & ~(np.isfinite(values) & (values > 0))
        if bad.any():
            index = int(np.flatnonzero(bad.to_numpy())[0])
            refuse(f"line {index + 2} has {column} {_cell(frame[column].iloc[index])!r}, not a number of seconds > 0")


def _cell(value):
    """A cell as the file wrote it: ``0``, ``-0.1``, ``'fast'`` (not ``np.int64(0)``)."""
    return value.item() if isinstance(value, np.generic) else value


class SweepWriteError(OSError):
    """A sweep's result file could not be written mid-sweep; ``writing`` keeps its ``kept`` rows and the sweep
    resumes from them when run again."""

    def __init__(self, message: str, writing: Path, kept: int):
        super().__init__(message)
        self.writing, self.kept = writing, kept

    def __str__(self) -> str:
        return self.args[0]


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
        if overwrite and not resume:  # what an earlier overwrite of other settings left before it completed
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
        """Add (or replace) one point's rows and rewrite both files atomically, the sidecar first.

        Raises
        ------
        SweepWriteError
            If a write fails (a full disk, a file made read-only): the files keep what they had.
        """
        for row in rows:
            self.rows[_key(row, self.columns)] = row
        with self._writes():
            self._write_sidecar(False)
            with atomic_write(self.writing, "w") as file:
                pd.DataFrame(list(self.rows.values())).to_csv(file, index=False)

    @contextlib.contextmanager
    def _writes(self):
        """Turn an ``OSError`` of the writes in the block into a :class:`SweepWriteError` saying what was kept."""
        try:
            yield
        except OSError as error:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                kept = len(read_complete_rows(self.writing)) if self.writing.is_file() else 0
            raise SweepWriteError(f"writing {self.writing.name} failed ({error.strerror or error}); it keeps its "
                                  f"{kept} row(s), in {self.writing}", self.writing, kept) from error

    def finish(self, expected_keys) -> None:
        """Mark the sweep complete once its rows are exactly the expected keys' (each measured, none other);
        move a partial file onto :attr:`path` (the CSV, then its sidecar: :func:`writing_file` finishes a move a
        stop cut)."""
        expected = {_key(key, self.columns): key for key in expected_keys}
        missing = [key for name, key in expected.items() if name not in self.rows]
        if missing:
            raise RuntimeError(f"{self.writing}: {len(missing)} point(s) not measured, e.g. {missing[0]}")
        other = [row for name, row in self.rows.items() if name not in expected]
        if other:
            raise RuntimeError(f"{self.writing}: {len(other)} row(s) of points this sweep does not measure, e.g. "
                               f"{dict(zip(self.columns, _key(other[0], self.columns)))}; not marked complete")
        with self._writes():
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
