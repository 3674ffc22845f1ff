"""Files read and written safely: :func:`atomic_write` (a reader sees the old file or the new one, never a
partial one) and :func:`regular_file` (no read blocks on a FIFO or runs forever on a device)."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path


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
        If ``path`` does not exist or is not a regular file; the message names ``name`` and the path.
    """
    file = Path(path)
    if not file.exists():
        raise ValueError(f"{name} {str(file)!r} does not exist")
    kind = _kind(file.stat().st_mode)
    if kind != "regular file":
        raise ValueError(f"{name} {str(file)!r} is a {kind}, not a regular file: refusing to read it")
    return file


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
        socket, a folder): renaming over it would replace it.
    """
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
