"""Input checks shared by the package, and the error that marks a caller's mistake.

Every public theory function turns its inputs into float arrays with :func:`as_array`, which
rejects values outside their domain with a :class:`UsageError` (a ``ValueError``) naming the
argument, the value and what is allowed, e.g. ``gamma must be a whole number >= 1, got 2.5``;
:func:`broadcast` names arguments whose shapes clash and :func:`one_of` a name not in a list;
:func:`within_memory` refuses work whose arrays would pass :data:`MEMORY_LIMIT`, with the estimate.

:class:`UsageError` is how the ``moesd`` command tells a bad argument from a failure inside
the program: ``moesd.cli.main`` prints a ``UsageError`` as a one-line usage error (exit code
2) and lets every other exception through as a traceback. A sub-command checks its arguments
before any work: it raises ``UsageError`` itself, calls the package's validating functions
(which raise it), or wraps a check that raises something else (``zoo.get_model``'s KeyError,
``pandas.read_csv``'s ParserError on the user's file) in ``with usage_errors():``. The work
itself runs outside that block, so an internal error stays an internal error.

Output paths and devices are checked before any work too: :func:`writable_folder` (a folder, and
writable), :func:`new_file` (not there unless overwriting, a regular file, in a writable folder; :func:`new_files` for
several, no two at one path) and
:func:`torch_device` (a device torch knows and this machine has).
"""

from __future__ import annotations

import contextlib
import numbers
import os
import tempfile
from pathlib import Path

import numpy as np


class UsageError(ValueError):
    """A bad argument: the caller's mistake, reported in one line, never a program failure.

    Parameters
    ----------
    message : str
        What is wrong and what is allowed (``str(error)``).
    argument : str, optional
        The argument it concerns, as the function that raised it names it (``"tp"``, ``"draft_dtype"``,
        ``"hardware.peak_flops"``): the ``moesd`` command maps it to its flag, never the message's text.

    Attributes
    ----------
    message, argument
        As given.
    """

    def __init__(self, message: str = "", argument: str | None = None):
        super().__init__(message)
        self.message = message
        self.argument = argument


@contextlib.contextmanager
def usage_errors():
    """Re-raise a ``ValueError``, ``KeyError``, ``FileNotFoundError`` or ``FileExistsError`` raised in
    the block as a :class:`UsageError` with the same message.

    Wrap only the checking of a command's arguments, never the work they start.
    """
    try:
        yield
    except UsageError:
        raise
    except (ValueError, KeyError, FileNotFoundError, FileExistsError) as error:
        raise UsageError(str(error.args[0]) if error.args else repr(error), getattr(error, "argument", None)) \
            from error


def _describe(low, high, low_open, high_open, whole) -> str:
    """``a whole number >= 1``, ``a number in (0, 1]``..., what a domain allows."""
    kind = "a whole number" if whole else "a number"
    if low is not None and high is not None:
        return f"{kind} in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    if low is not None:
        return f"{kind} {'>' if low_open else '>='} {low:g}"
    if high is not None:
        return f"{kind} {'<' if high_open else '<='} {high:g}"
    return kind


def _first(array: np.ndarray, bad: np.ndarray) -> str:
    """The first offending value, written as the caller would: ``8``, ``2.5``, ``1e-19``, ``inf``."""
    value = (array[bad].flat[0] if array.ndim else array).item()
    if isinstance(value, int):
        return str(value)
    return str(int(value)) if value.is_integer() and abs(value) < 1e16 else repr(value)


LARGEST_WHOLE = 2.0**53
"""Whole numbers below this are exact in float64; ``as_array(..., whole=True)`` refuses larger ones."""
_INT64 = (-2**63, 2**63 - 1)


def _integer_range(whole: bool) -> str:
    """Where integers must lie: below 2^53 for whole numbers (exact in a float), else within int64."""
    if whole:
        return f"below 2^53 = {LARGEST_WHOLE:.0f} (beyond, a float does not hold every whole number)"
    return "within int64's range [-2^63, 2^63 - 1]"


def as_array(name: str, value, *, low=None, high=None, low_open=False, high_open=False,
             whole=False, finite=True) -> np.ndarray:
    """Return ``value`` as a float array after checking it lies in its domain.

    Parameters
    ----------
    name : str
        The argument's name, used in the error message.
    value : array_like
        Real numbers: Python or numpy numbers, sequences or arrays of them, pandas columns.
        Booleans, strings, complex numbers and ``None`` are refused, not converted, and so are integers
        outside int64's range (they would wrap where counts are stored as integers).
    low, high : float, optional
        Bounds of the domain; ``None`` means unbounded on that side.
    low_open, high_open : bool
        Whether the bound itself is excluded.
    whole : bool
        Require whole numbers (counts such as ``E`` or ``gamma``) below 2^53, :data:`LARGEST_WHOLE`, so
        that the float holds them exactly.
    finite : bool, default True
        Refuse infinities.

    Raises
    ------
    UsageError
        A ``ValueError`` naming the argument (its ``argument`` is ``name``), the offending value and the domain,
        if any element
        is not a real number, an integer beyond int64, NaN, infinite (unless ``finite`` is False),
        outside the bounds, or not whole (or not below 2^53) when ``whole`` is set.
    """
    allowed = _describe(low, high, low_open, high_open, whole)
    raw = value if isinstance(value, np.ndarray) else None
    if raw is None:
        try:
            raw = np.asarray(value)
        except (TypeError, ValueError) as error:  # ragged nesting
            raise UsageError(f"{name} must be {allowed} or an array of them, got {value!r}", name) from error
    kind = raw.dtype.kind
    if kind not in "iufO":
        raise UsageError(f"{name} must be {allowed}, got {_short(value)} "
                         f"(of type {type(value).__name__}, dtype {raw.dtype})", name)
    # Python objects numpy converts silently: [True, 2] to [1, 2], [2**63, 1] to floats, 2**63 to uint64.
    items = raw.ravel().tolist() if kind == "O" else value if isinstance(value, (list, tuple)) and raw.ndim == 1 else ()
    for item in items:
        if isinstance(item, (bool, np.bool_)) or (kind == "O" and not isinstance(item, numbers.Real)):
            raise UsageError(f"{name} must be {allowed}, got {item!r} (a {type(item).__name__})", name)
        if isinstance(item, numbers.Integral) and not _INT64[0] <= item <= _INT64[1]:
            raise UsageError(f"{name} must be {allowed} {_integer_range(whole)}, got {_short(item)}", name)
    if kind == "u" and raw.size and raw.max() > _INT64[1]:
        raise UsageError(f"{name} must be {allowed} {_integer_range(whole)}, got {raw.max()}", name)
    try:
        array = np.asarray(raw, dtype=float)
    except OverflowError as error:  # Python integers beyond float range
        raise UsageError(f"{name} must be {allowed} within float range, got {_short(value)}", name) from error
    nan = np.isnan(array)
    if nan.any():
        raise UsageError(f"{name} must be {allowed}, got NaN", name)
    if finite and np.isinf(array).any():
        raise UsageError(f"{name} must be {allowed}, got {_first(array, np.isinf(array))}", name)
    if low is not None:
        bad = array <= low if low_open else array < low
        if bad.any():
            raise UsageError(f"{name} must be {allowed}, got {_first(array, bad)}", name)
    if high is not None:
        bad = array >= high if high_open else array > high
        if bad.any():
            raise UsageError(f"{name} must be {allowed}, got {_first(array, bad)}", name)
    if whole:
        bad = np.isinf(array) | (array != np.round(array))
        if bad.any():
            raise UsageError(f"{name} must be {allowed}, got {_first(array, bad)}", name)
        bad = np.abs(array) >= LARGEST_WHOLE
        if bad.any():
            raise UsageError(f"{name} must be {allowed} {_integer_range(whole)}, "
                             f"got {_first(raw if kind in 'iu' else array, bad)}", name)
    return array


MEMORY_LIMIT = 4 * 2**30
"""Bytes a statistic may allocate for its arrays before :func:`within_memory` refuses it (4 GiB)."""


def within_memory(what: str, values: int, bytes_each: int = 8) -> None:
    """Refuse, before any allocation, work whose arrays would hold more than :data:`MEMORY_LIMIT` bytes.

    Parameters
    ----------
    what : str
        The work and the sizes that set its memory, e.g. ``"p of E = 1000000000 experts x 400 token counts"``.
    values : int
        Values the largest arrays hold together.
    bytes_each : int, default 8
        Bytes per value (8 for float64).
    """
    needed = int(values) * bytes_each
    if needed > MEMORY_LIMIT:
        raise UsageError(f"{what} would need about {needed / 2**30:.3g} GiB of memory, more than the "
                         f"{MEMORY_LIMIT / 2**30:g} GiB allowed: ask for less at a time")


def _short(value) -> str:
    """``repr`` cut to one short line, for messages about arbitrary objects."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def broadcast(**arrays: np.ndarray) -> tuple[int, ...]:
    """The common shape of named arrays, or a ``UsageError`` naming the arguments that clash."""
    try:
        return np.broadcast_shapes(*(np.shape(a) for a in arrays.values()))
    except ValueError:
        shapes = ", ".join(f"{name} {np.shape(a)}" for name, a in arrays.items())
        raise UsageError(f"{' and '.join(arrays)} must broadcast together, got shapes {shapes}") from None


def one_of(name: str, value, allowed) -> None:
    """Refuse ``value`` unless it is one of the strings ``allowed``, naming them."""
    if not isinstance(value, str) or value not in allowed:
        raise UsageError(f"{name} must be one of {', '.join(map(repr, allowed))}, got {_short(value)}", name)


def writable_folder(name: str, path) -> Path:
    """Refuse a folder that is a file or cannot be written (the nearest existing parent is tried).

    Returns the folder as a ``pathlib.Path``; it need not exist yet (writers create it).
    """
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"{name} {str(folder)!r} is not a folder", name)
    existing = next(p for p in (folder, *folder.absolute().parents) if p.exists())
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as error:
        raise UsageError(f"{name} {str(folder)!r} cannot be written ({existing}: {error.strerror}); "
                         "choose a writable folder", name) from None
    return folder


def new_file(name: str, path, overwrite: bool = False) -> Path:
    """Refuse an output file that exists (unless ``overwrite``), is not a regular file, or whose folder
    cannot be written; return it as a ``pathlib.Path``.

    This is the rule for every file a command writes: checked here before any work (a command writing
    several files checks them together with :func:`new_files`), then written with
    :func:`moesd._files.atomic_write`, so that a write that fails or is interrupted leaves the old file.
    """
    file = Path(path)
    if file.exists() and not file.is_file():
        raise UsageError(f"{name} {str(file)!r} is not a regular file (a folder or a device): refusing to replace it", name)
    if file.exists() and not overwrite:
        raise UsageError(f"{name} {str(file)!r} exists; pass --overwrite to replace it", name)
    writable_folder(f"the folder of {name}", file.absolute().parent)
    return file


def new_files(outputs: dict, overwrite: bool = False) -> dict:
    """Check the output files of one command with :func:`new_file`, and refuse two at one path.

    Parameters
    ----------
    outputs : dict
        Each output's name (its option, e.g. ``"--csv"``) and path; an output not asked for (``None``) is skipped.
    overwrite : bool
        Replace existing files (``--overwrite``).

    Returns
    -------
    dict
        The name and ``pathlib.Path`` of each output asked for.

    Raises
    ------
    UsageError
        As :func:`new_file` does, or naming both outputs if two resolve to one file (symbolic links followed):
        the second would replace the first.
    """
    files, seen = {}, {}
    for name, path in outputs.items():
        if path is None:
            continue
        files[name] = new_file(name, path, overwrite)
        real = os.path.realpath(path)
        if real in seen:
            raise UsageError(f"{seen[real]} and {name} name one file, {str(path)!r}: give each its own path")
        seen[real] = name
    return files


def torch_device(name: str, device: str) -> None:
    """Refuse a torch device name that is not one, or a CUDA device this machine does not have."""
    import torch

    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        raise UsageError(f"{name} {device!r} is not a torch device (cpu, cuda, cuda:1...)", name) from None
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(f"{name} {device!r} is not available: this torch ({torch.__version__}) sees no CUDA "
                             "device; use cpu", name)
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            raise UsageError(f"{name} {device!r} is not available: {torch.cuda.device_count()} CUDA device(s)", name)
