"""What every reader of other tools' routing logs shares: field lookup, checked values, JSONL lines, the ragged rule.

The readers of :mod:`moesd.routing.importers` and :mod:`moesd.routing.vllm_logs` find a record's fields
under any of several spellings (:func:`field_names`, :func:`get_field`), check the values they take from it
(:func:`whole_number`, :func:`expert_ids`, :func:`request_key`, :func:`router_weights`), read JSONL files
(:func:`read_jsonl`), accept one of the :data:`RAGGED` rules for tokens logged in only some layers
(:func:`check_ragged`), check ``E`` before reading (:func:`given_num_experts`) and infer it when it is not given
(:func:`infer_num_experts`), and name their file(s) in every error and refuse FIFOs and devices
(:func:`names_its_files`). Errors name the file, the line and the field.
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
import os
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path

from moesd._checks import LARGEST_WHOLE
from moesd._files import parse_json, regular_file

RAGGED = ("drop", "keep", "error")
"""What a reader does with tokens logged in only some layers: drop them, keep them with the layers they
have (the others marked :data:`moesd.routing.traces.MISSING`), or refuse the file; a warning names them."""


def field_names(defaults: dict, fields: Mapping | None) -> dict[str, tuple[str, ...]]:
    """The names to try for each field: ``defaults`` overridden by ``fields``.

    Parameters
    ----------
    defaults : dict
        Names to try, in order, per key.
    fields : mapping, optional
        A name or a sequence of names per key, replacing the defaults of that key.

    Raises
    ------
    ValueError
        If ``fields`` has a key that ``defaults`` has not.
    """
    names = dict(defaults)
    for key, value in (fields or {}).items():
        if key not in defaults:
            raise ValueError(f"fields has an unknown key {key!r}; known keys are {sorted(defaults)}")
        names[key] = (value,) if isinstance(value, str) else tuple(value)
    return names


def get_field(record: dict, names: tuple[str, ...], key: str, where: str, required: bool = True):
    """The value of the first of ``names`` that ``record`` has; None if it has none and the field is optional.

    A missing required field is a ValueError naming ``where`` (file and line), ``key`` and the names tried.
    """
    for name in names:
        if name in record:
            return record[name]
    if required:
        raise ValueError(f"{where}: no {key} field (looked for {', '.join(names)})")
    return None


def whole_number(value, where: str, name: str) -> int:
    """``value`` as an int if it is a finite whole number below 2^53 in magnitude (not a bool, NaN or infinity;
    ids and counts are stored as int64, and a float holds every whole number only below 2^53), else a
    ValueError naming ``where`` and ``name``."""
    if not _is_whole(value):
        raise ValueError(f"{where}: {name} must be a whole number, got {value!r}")
    if abs(value) >= LARGEST_WHOLE:
        raise ValueError(f"{where}: {name} must be a whole number below 2^53 in magnitude, got {value!r}")
    return int(value)


def _is_whole(value) -> bool:
    """Whether ``value`` is a finite whole number, not a bool."""
    return not isinstance(value, bool) and isinstance(value, numbers.Real) and math.isfinite(value) \
        and value == int(value)


def given_num_experts(num_experts) -> int | None:
    """``num_experts`` as an int, checked before a file is read (a whole number >= 1), or None when not given."""
    if num_experts is not None and not (_is_whole(num_experts) and num_experts >= 1):
        raise ValueError(f"num_experts must be a whole number >= 1, got {num_experts!r}")
    return None if num_experts is None else int(num_experts)


def expert_ids(value, where: str, name: str, num_experts=None) -> list[int]:
    """``value`` as a non-empty list of distinct whole-number expert ids in ``[0, num_experts)``.

    Parameters
    ----------
    value : object
        The field's value; a list of booleans (``[true, false]``) is not one of ids.
    where, name : str
        File and line, and the field, for the message.
    num_experts : int, optional
        ``E``; without it ids need only be >= 0.

    Raises
    ------
    ValueError
        Naming ``where`` and ``name``.
    """
    if not isinstance(value, list) or not value:
        raise ValueError(f"{where}: {name} must be a non-empty list of expert ids, got {value!r}")
    if not all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in value):
        raise ValueError(f"{where}: {name} must list whole-number expert ids, got {value!r}")
    ids = [whole_number(v, where, name) for v in value]
    outside = [i for i in ids if i < 0 or (num_experts is not None and i >= num_experts)]
    if outside:
        allowed = ">= 0" if num_experts is None else f"in [0, {num_experts}) (num_experts = {num_experts})"
        raise ValueError(f"{where}: {name} {ids}: expert id {outside[0]} is not {allowed}")
    if len(set(ids)) != len(ids):
        raise ValueError(f"{where}: {name} {ids} lists an expert twice")
    return ids


def request_key(value, where: str, first_of_kind: dict):
    """A sequence or request id as given, refusing one file that mixes numbers and strings.

    1 and "1" would otherwise be one request (or two, depending on the reader): ``first_of_kind`` remembers
    where each kind was first seen (pass the same dict for every record of a file).
    """
    if isinstance(value, bool) or not isinstance(value, (str, numbers.Integral)):
        raise ValueError(f"{where}: a sequence id must be a string or a whole number, got {value!r}")
    kind, other = ("string", "number") if isinstance(value, str) else ("number", "string")
    first_of_kind.setdefault(kind, where)
    if other in first_of_kind:
        raise ValueError(f"{where}: sequence id {value!r} is a {kind} but {first_of_kind[other]} has a {other}; "
                         "ids of mixed types are ambiguous (1 and \"1\"): write them all one way")
    return value


def router_weights(value, count: int, where: str, name: str) -> list[float] | None:
    """``value`` as ``count`` router weights (floats), None when absent, else a ValueError naming ``where``."""
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != count or \
            not all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in value):
        raise ValueError(f"{where}: {name} must list one number per expert id, got {value!r}")
    return [float(v) for v in value]


def read_jsonl(path: Path) -> Iterable[tuple[int, dict]]:
    """(line number, record) of each non-blank line of a JSONL file; a line that is not a JSON object
    is a ValueError naming the file and the line."""
    with open(path, encoding="utf-8") as file:
        for number, line in enumerate(file, start=1):
            if not line.strip():
                continue
            record = parse_json(line, f"{path}:{number}")
            if not isinstance(record, dict):
                raise ValueError(f"{path}:{number}: expected a JSON object")
            yield number, record


def check_ragged(ragged: str) -> None:
    """Refuse a ``ragged`` rule that is not one of :data:`RAGGED`."""
    if ragged not in RAGGED:
        raise ValueError(f"ragged must be one of {RAGGED}, got {ragged!r}")


def infer_num_experts(num_experts, largest_id: int, source) -> int:
    """``num_experts`` if given, else ``largest_id + 1`` with a warning naming ``source``."""
    if num_experts is not None:
        return num_experts
    warnings.warn(f"{source}: num_experts not given; inferring E = {largest_id + 1} from the largest "
                  "expert id (pass num_experts when some experts may never be chosen)", stacklevel=3)
    return largest_id + 1


def names_its_files(read):
    """Make a reader name its file(s) in every error (missing, a folder, binary bytes, a bad trace), refuse a
    FIFO or a device before reading (it would block or never end), and issue its warnings at the caller's line
    whatever the depth they came from (also when it then fails).

    ``read`` takes a path, or a list of paths, as its first argument; a list reaches it as a list of
    :class:`pathlib.Path`.
    """
    signature = inspect.signature(read)
    first = next(iter(signature.parameters))

    @functools.wraps(read)
    def reader(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        paths = bound.arguments[first]
        single = isinstance(paths, (str, os.PathLike))
        files = [Path(paths)] if single else [Path(p) for p in paths]
        if not single:
            bound.arguments[first] = files
        name = files[0] if len(files) == 1 else (files[0].parent if files else None)
        for file in files:
            if file.exists() and not file.is_dir():
                regular_file(first, file)
        caught = []
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                return read(*bound.args, **bound.kwargs)
        except (FileNotFoundError, IsADirectoryError) as error:
            problem = "no such file" if isinstance(error, FileNotFoundError) else "a folder, not a routing file"
            raise type(error)(f"{error.filename or name}: {problem}") from None
        except UnicodeDecodeError:
            raise ValueError(f"{name}: not UTF-8 text (a binary file?)") from None
        except ValueError as error:
            if name is None or any(str(path) in str(error) for path in files):
                raise
            raise ValueError(f"{name}: {error}") from None
        finally:
            for warning in caught:
                warnings.warn(warning.message, warning.category, stacklevel=2)
    return reader

