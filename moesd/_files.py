"""Atomic file writes: a reader sees the old file or the new one, never a partial one."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


@contextlib.contextmanager
def atomic_write(path, mode: str = "wb"):
    """Open a temporary file beside ``path`` and move it onto ``path`` when the block succeeds.

    On any error the temporary file is removed and ``path`` is left as it was. The new file gets
    the permissions of a normally created file (0666 less the umask).
    """
    path = Path(path)
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
