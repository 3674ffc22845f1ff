"""Files read and written safely: :func:`atomic_write` (a reader sees the old file or the new one, never a
partial one), :func:`regular_file` (no read blocks on a FIFO, runs forever on a device or takes a file larger
than :data:`MAX_READ_BYTES`), :func:`parse_json` and :func:`read_json` (JSON of bounded size and nesting, errors
naming the file) and :func:`npz_arrays` (arrays of an ``.npz`` archive, their declared sizes checked before any
is read)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import tempfile
import zipfile
from pathlib import Path

MAX_READ_BYTES = 1 << 30
"""The largest file a reader of the package takes whole (1 GiB): a result CSV of the shipped studies is under
1 MB, a sidecar a few kB; a larger one is another file, or a file grown by mistake."""

MAX_ARRAY_BYTES = 4 << 30
"""The most bytes the arrays of one ``.npz`` archive may declare together (4 GiB, the memory bound of
:data:`moesd._checks.MEMORY_LIMIT`)."""


def _kind(mode: int) -> str:
    """What a file of ``st_mode`` ``mode`` is, in words ("regular file", "FIFO", ...)."""
    return ("regular file" if stat.S_ISREG(mode) else "folder" if stat.S_ISDIR(mode)
            else "character device" if stat.S_ISCHR(mode) else "block device" if stat.S_ISBLK(mode)
            else "FIFO" if stat.S_ISFIFO(mode) else "socket" if stat.S_ISSOCK(mode) else "special file")


def regular_file(name: str, path) -> Path:
    """Refuse to read ``path`` unless it is an existing regular file (symbolic links followed).

    A FIFO would block the reader forever and a device such as ``/dev/zero`` never ends.

    Parameters
    ----------
    name : str
        The argument or option naming the file, for the message (e.g. ``"--trace"``).
    path : str or os.PathLike
        The file.

    Returns
    -------
    pathlib.Path
        ``path``.

    Raises
    ------
    ValueError
        If ``path`` does not exist, cannot be looked up (a loop of symbolic links, a name too long), is not a
        regular file or holds more than :data:`MAX_READ_BYTES`; the message names ``name`` and the path.
    """
    file = Path(path)
    try:
        status = file.stat()
    except FileNotFoundError:
        raise ValueError(f"{name} {str(file)!r} does not exist") from None
    except OSError as error:  # ELOOP, ENAMETOOLONG, ENOTDIR, EACCES
        raise ValueError(f"{name} {str(file)!r} cannot be read: {path_problem(error)}") from None
    kind = _kind(status.st_mode)
    if kind != "regular file":
        raise ValueError(f"{name} {str(file)!r} is a {kind}, not a regular file: refusing to read it")
    if status.st_size > MAX_READ_BYTES:
        raise ValueError(f"{name} {str(file)!r} holds {status.st_size / 2**30:.3g} GiB, more than the "
                         f"{MAX_READ_BYTES / 2**30:g} GiB a file read whole may hold: is it the right file?")
    return file


def lookup_problem(path) -> str | None:
    """Why ``path`` cannot be looked up (:func:`path_problem`), or None when it exists or simply does not."""
    try:
        os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as error:
        return path_problem(error)
    return None


def path_problem(error: OSError) -> str:
    """Why a path could not be used, in words (a loop of symbolic links, a name too long...)."""
    if error.errno == errno.ELOOP:
        return "a loop of symbolic links"
    if error.errno == errno.ENAMETOOLONG:
        return "a name too long for the file system"
    return error.strerror or str(error)


def parse_json(text, where: str):
    """The JSON value of ``text``; a ``ValueError`` ``"<where>: not JSON (<why>)"`` naming ``where`` (a file, a
    line) if it is not JSON or nests deeper than Python's parser follows (which raises ``RecursionError``)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{where}: not JSON ({error.msg} at line {error.lineno} column {error.colno})") from None
    except RecursionError:
        raise ValueError(f"{where}: not JSON this reader can take (arrays or objects nested deeper than about "
                         f"{json_depth_limit()} levels)") from None


def json_depth_limit() -> int:
    """About how deep JSON may nest before the parser gives up: the interpreter's recursion limit."""
    import sys

    return sys.getrecursionlimit()


def read_json(name: str, path):
    """The JSON value of a regular file (:func:`regular_file`), errors naming ``name`` and the file.

    Raises
    ------
    ValueError
        As :func:`regular_file` does (naming ``name``); or naming the file if it is not UTF-8 text or not JSON
        (:func:`parse_json`).
    """
    file = regular_file(name, path)
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{file}: not JSON (not UTF-8 text: {error.reason})") from None
    return parse_json(text, str(file))


def npz_arrays(path, limit: int = MAX_ARRAY_BYTES) -> dict:
    """The arrays of an ``.npz`` archive (no pickles), each member's declared shape checked before it is read.

    Every member's ``.npy`` header declares a dtype and a shape; the bytes they make must be at most what the
    archive says the member holds (an archive that declares far more than it holds would have numpy allocate
    the declared size), and all of them together at most ``limit``.

    Raises
    ------
    ValueError
        Naming the member, its declared shape and bytes, if it declares more than it holds or the arrays more
        than ``limit``; or if the archive or a member header cannot be read.
    """
    import numpy as np

    arrays, total = {}, 0
    try:
        with zipfile.ZipFile(path) as archive:
            members = [info for info in archive.infolist() if info.filename.endswith(".npy")]
            for info in members:
                with archive.open(info) as member:
                    version = np.lib.format.read_magic(member)
                    read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                                   else np.lib.format.read_array_header_2_0)
                    shape, _, dtype = read_header(member)
                    declared = int(np.prod(shape, dtype=object)) * dtype.itemsize
                    if declared > info.file_size:
                        raise ValueError(f"member {info.filename} declares shape {shape} of {dtype} "
                                         f"({declared} bytes) but holds {info.file_size} bytes")
                total += declared
                if total > limit:
                    raise ValueError(f"its arrays declare {total / 2**30:.3g} GiB, more than the "
                                     f"{limit / 2**30:g} GiB allowed")
            with np.load(path, allow_pickle=False) as data:
                arrays = {name: data[name] for name in data.files}
    except zipfile.BadZipFile as error:
        raise ValueError(f"not an .npz archive ({error})") from None
    return arrays


@contextlib.contextmanager
def atomic_write(path, mode: str = "wb"):
    """Open a temporary file beside ``path`` and move it onto ``path`` when the block succeeds.

    On any error the temporary file is removed and ``path`` is left as it was. The new file gets
    the permissions of a normally created file (0666 less the umask). A symbolic link is followed
    (the file it names is replaced, the link kept).

    Raises
    ------
    ValueError
        If ``path`` exists and is not a regular file (a device such as ``/dev/full``, a FIFO, a
        socket, a folder): renaming over it would replace it; or if it cannot be looked up (a loop of
        symbolic links, a name too long).
    """
    problem = lookup_problem(path)  # a loop of links, a name too long: refused before any temporary file is made
    if problem:
        raise ValueError(f"{path} cannot be written: {problem}")
    path = Path(os.path.realpath(path))
    if path.exists():
        kind = _kind(path.stat().st_mode)
        if kind != "regular file":
            raise ValueError(f"{path} is a {kind}, not a regular file: refusing to replace it")
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, mode) as file:
            yield file
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
