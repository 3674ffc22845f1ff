"""What every reader of other tools' routing logs shares: field lookup, checked values, JSONL lines, the ragged rule.

The readers of :mod:`moesd.routing.importers` and :mod:`moesd.routing.vllm_logs` find a record's fields
under any of several spellings (:func:`field_names`, :func:`get_field`), check the values they take from it
(:func:`whole_number`, :func:`expert_ids`, :func:`router_weights`), read JSONL files (:func:`read_jsonl`),
accept one of the :data:`RAGGED` rules for tokens logged in only some layers (:func:`check_ragged`), infer
``E`` when it is not given (:func:`infer_num_experts`), and name their file(s) in every error
(:func:`names_its_files`). Errors name the file, the line and the field.
"""

from __future__ import annotations

import functools
import inspect
import json
import numbers
import os
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path

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
    """``value`` as an int if it is a whole number (not a bool), else a ValueError naming ``where`` and ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or value != int(value):
        raise ValueError(f"{where}: {name} must be a whole number, got {value!r}")
    return int(value)


def expert_ids(value, where: str, name: str) -> list[int]:
    """``value`` as a non-empty list of whole-number expert ids, else a ValueError naming ``where`` and ``name``."""
    if not isinstance(value, list) or not value:
        raise ValueError(f"{where}: {name} must be a non-empty list of expert ids, got {value!r}")
    return [whole_number(v, where, name) for v in value]


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
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{number}: not JSON: {error.msg}") from None
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
    """Make a reader name its file(s) in every error (missing, a folder, binary bytes, a bad trace), and issue
    its warnings at the caller's line whatever the depth they came from (also when it then fails).

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

