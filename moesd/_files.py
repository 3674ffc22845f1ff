"""Atomic file writes: a reader sees the old file or the new one, never a partial one."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path


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
        kind = path.stat().st_mode
        if not stat.S_ISREG(kind):
            name = ("folder" if stat.S_ISDIR(kind) else "character device" if stat.S_ISCHR(kind)
                    else "block device" if stat.S_ISBLK(kind) else "FIFO" if stat.S_ISFIFO(kind)
                    else "socket" if stat.S_ISSOCK(kind) else "special file")
            raise ValueError(f"{path} is a {name}, not a regular file: refusing to replace it")
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
